"""JavaScript identifiers for tool names (reference-runtime 8.3).

Pure functions with no dependencies: the host uses them to key `tools.*`, the model layer to
describe the tools.
"""

from __future__ import annotations


def _valid(ch: str, first: bool) -> bool:
    if ch in "_$" or ("a" <= ch <= "z") or ("A" <= ch <= "Z"):
        return True
    return not first and "0" <= ch <= "9"


def normalize_identifier(name: str) -> str:
    """The JavaScript identifier a tool called `name` gets on the `tools` object.

    Each character that cannot stand at its place in an ASCII identifier becomes one `_` (a
    leading digit is replaced, not prefixed); an empty name becomes `_`.

    >>> normalize_identifier("hidden-dynamic-tool")
    'hidden_dynamic_tool'
    >>> normalize_identifier("9lives")
    '_lives'
    """
    if not name:
        return "_"
    return "".join(ch if _valid(ch, i == 0) else "_" for i, ch in enumerate(name))
