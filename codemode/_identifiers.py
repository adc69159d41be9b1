"""JavaScript identifiers for tool names (design.md, runtime 8.3).

Pure functions with no dependencies: the host uses them to key `tools.*`, the model layer to
describe the tools.
"""

from __future__ import annotations

import re

_NOT_IDENTIFIER_PART = re.compile(r"[^A-Za-z0-9_$]")
# One regular expression pass instead of a Python call per character: the host normalizes
# every enabled tool's name for every cell it starts.


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
    identifier = _NOT_IDENTIFIER_PART.sub("_", name)
    if "0" <= identifier[0] <= "9":
        return "_" + identifier[1:]
    return identifier
