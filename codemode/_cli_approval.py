"""`codemode run`'s decisions on nested calls: `--approve ask|allow|deny`, `--allow`, `--deny`.

Rules (docs/governance.md, docs/cli.md):
1. `--deny PATTERN` and `--allow PATTERN` (shell-style patterns of the name the cell calls a tool
   by, `send_*`) decide any tool, a deny first; the rest is decided by `--approve` for the tools
   that need approval and allowed otherwise.
2. `--approve` defaults to `ask` when standard input is a terminal and to `deny` when it is not:
   never an unattended side effect by default.
3. An ask prompts one line on standard error and reads the answer from standard input
   (standard output stays what the model sees); `y` or `yes` approves, anything else denies.
   Asks are put one at a time: a second call's question waits for the first answer.
"""

from __future__ import annotations

import fnmatch
import json
import sys
from collections.abc import Sequence
from typing import TextIO

import trio

from ._api import NestedToolCall, ToolDefinition
from ._governance import (
    Allow,
    ApprovalRequest,
    Approve,
    Ask,
    Decision,
    Deny,
    MarksApproval,
    PolicyBase,
    Verdict,
)
from ._identifiers import normalize_identifier

APPROVE_MODES = ("ask", "allow", "deny")


def default_mode(stdin: TextIO) -> str:
    """Rule 2."""
    try:
        return "ask" if stdin.isatty() else "deny"
    except ValueError:  # a closed standard input
        return "deny"


class CliPolicy(PolicyBase):
    """Rule 1."""

    def __init__(
        self,
        mode: str,
        allow: Sequence[str],
        deny: Sequence[str],
        marks: MarksApproval | None,
        definitions: Sequence[ToolDefinition],
    ) -> None:
        self._mode = mode
        self._allow = list(allow)
        self._deny = list(deny)
        self._marks = marks
        self._identifiers = {d.tool_name: normalize_identifier(d.name) for d in definitions}

    async def decide(self, call: NestedToolCall) -> Decision:
        name = self._identifiers.get(call.tool_name, call.tool_name.name)
        for pattern in self._deny:
            if fnmatch.fnmatchcase(name, pattern):
                return Deny(f"--deny {pattern}")
        for pattern in self._allow:
            if fnmatch.fnmatchcase(name, pattern):
                return Allow()
        if self._marks is None or not self._marks.needs_approval(call.tool_name):
            return Allow()
        if self._mode == "allow":
            return Allow()
        if self._mode == "deny":
            return Deny("it needs approval (run with --approve ask or --approve allow)")
        return Ask()


class TerminalApprover:
    """Rule 3: a question on `err`, the answer from `stdin`."""

    def __init__(self, stdin: TextIO, err: TextIO) -> None:
        self._stdin = stdin
        self._err = err
        self._one_at_a_time = trio.Lock()

    async def __call__(self, request: ApprovalRequest) -> Verdict:
        arguments = json.dumps(request.arguments, ensure_ascii=False)
        async with self._one_at_a_time:
            self._err.write(
                f"codemode: allow tools.{request.identifier}({arguments})"
                f" [{request.call_id} of cell {request.cell_id}]? [y/N] "
            )
            self._err.flush()
            answer = await trio.to_thread.run_sync(self._stdin.readline, abandon_on_cancel=True)
        if answer.strip().lower() in ("y", "yes"):
            return Approve()
        return Deny("the user declined" if answer else "no answer (standard input closed)")


def terminal_approver() -> TerminalApprover:
    return TerminalApprover(sys.stdin, sys.stderr)
