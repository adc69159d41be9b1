"""Well-formed text: what becomes of a lone surrogate on its way into a cell.

A Python `str` may hold a lone surrogate (an SDK's JSON decoder makes one of a model's
`"\\ud83d"` escape); UTF-8 has no form for it, so it cannot reach the engine or the wire as it
is. Strings leaving a cell are well-formed already (the engine writes U+FFFD for one, engine
rule 6); strings entering it are made so here, the same way on every provider.

Pure functions, no dependencies.
"""

from __future__ import annotations


def well_formed(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD; `text` itself when it has none.

    A surrogate pair split over two code points is joined into its character, as UTF-16 reads
    it.

    >>> well_formed("half \\ud83d")
    'half \\ufffd'
    """
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text
