"""codemode_host: the code-mode host, which runs cells in QuickJS.

Layers, each knowing only the one below it (DESIGN section 1): `engine` (the QuickJS binding
and the cell globals), then the runtime (sessions and cells) and the server (the wire).
"""
