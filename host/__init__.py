"""codemode_host: the code-mode host, which runs cells in QuickJS.

Layers, each knowing only the one below it (design.md, design 1): `engine` (the QuickJS binding
and the cell globals), `runtime` (sessions, cells, observers, delegate calls; no wire), and
`server` (frames <-> runtime), run on stdin/stdout by `__main__` (`codemode-host`).
"""
