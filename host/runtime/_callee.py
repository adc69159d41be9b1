"""Naming the callee of a failed call, as the reference's error text does.

QuickJS reports calling something that is not a function as a bare `TypeError: not a function`;
the reference (V8) names what was called: `TypeError: tools.hidden is not a function` (reference
test `app_only_tools_are_not_visible_or_runnable_by_code_mode_model`). The error's first stack
frame gives the line and column of the call in the cell's source; the callee's text is read
from there: a member chain (`tools.hidden`, `a.b.c`), or a chain with one quoted key
(`tools["x-y"]`, named `tools.x-y` as V8 does). When the source at that place is anything else,
the text is left as QuickJS made it.
"""

from __future__ import annotations

import re

_BARE = "TypeError: not a function"
_FRAME = re.compile(r"\(exec_main\.mjs:(\d+):(\d+)\)")
_CHAIN_END = re.compile(r"[\w$][\w$]*(?:\??\.[\w$]+)*\??\.?$")
_NAME = re.compile(r"[\w$]+")
_QUOTED_KEY = re.compile(r"""\[\s*(["'])([^"'\\\n]*)\1\s*\]""")


def name_the_callee(error_text: str, source: str) -> str:
    """`error_text` with a bare "not a function" naming its callee, when the source shows it."""
    first, _, rest = error_text.partition("\n")
    if first != _BARE:
        return error_text
    frame = _FRAME.search(rest)
    if frame is None:
        return error_text
    callee = _callee_at(source, int(frame.group(1)), int(frame.group(2)))
    if callee is None:
        return error_text
    return f"TypeError: {callee} is not a function" + ("\n" + rest if rest else "")


def _callee_at(source: str, line_number: int, column: int) -> str | None:
    lines = source.split("\n")
    if not 1 <= line_number <= len(lines):
        return None
    line = lines[line_number - 1]
    start = column - 1
    name = _NAME.match(line, start) if 0 <= start < len(line) else None
    if name is None:
        return None
    before = _CHAIN_END.search(line[:start]) if line[:start].endswith(".") else None
    callee = (before.group(0) if before else "") + name.group(0)
    key = _QUOTED_KEY.match(line, name.end())
    if key is not None:
        callee = f"{callee}.{key.group(2)}"
    return callee.replace("?.", ".")
