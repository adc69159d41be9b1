"""The span tree of a run as text, for a person reading it (`codemode run --trace`).

    code_mode.exec  12.4 ms
      code_mode.cell  11.9 ms  outcome=completed tool_calls=1 cpu_ms=0.2
        code_mode.observe  11.7 ms  kind=initial_response outcome=completed
        code_mode.tool_call  0.3 ms  gen_ai.tool.name=add outcome=ok

Children are listed by start time under their parent; a few attributes that tell the story
follow each span's duration (never a payload: the settings decide what spans hold at all).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

_SHOWN = (
    "codemode.cell.outcome",
    "error.type",
    "codemode.cell.tool_calls",
    "codemode.cell.cpu_ms",
    "codemode.observe.kind",
    "codemode.observe.outcome",
    "gen_ai.tool.name",
    "codemode.tool_call.outcome",
)


def _label(key: str) -> str:
    return key.rpartition(".")[2] if key.startswith("codemode.") else key


def render_tree(spans: list[Any]) -> str:
    """The spans (the SDK's `ReadableSpan`s) as an indented tree, one line each."""
    ids = {span.context.span_id for span in spans}
    children: dict[int | None, list[Any]] = defaultdict(list)
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        children[parent if parent in ids else None].append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in sorted(children[parent], key=lambda s: s.start_time or 0):
            took = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
            attributes = dict(span.attributes or {})
            shown = " ".join(
                f"{_label(key)}={attributes[key]}" for key in _SHOWN if key in attributes
            )
            lines.append(f"{'  ' * depth}{span.name}  {took:.1f} ms  {shown}".rstrip())
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return "\n".join(lines)
