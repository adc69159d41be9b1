"""Governed nested calls (`codemode._governance`, docs/governance.md): the policy's decisions,
approvals, hooks and the journal, with the real engine on every provider row."""

from __future__ import annotations

from typing import Any, Literal

import pytest
import trio

import codemode
from codemode import (
    Allow,
    ApprovalRequest,
    Approve,
    Ask,
    CodeMode,
    Deny,
    ExecuteRequest,
    NestedToolCall,
    PolicyBase,
    Provider,
    Toolbox,
    governed,
)
from codemode._governance import NO_APPROVER, Decision, Verdict

BOUND = 30


class Tools:
    """A toolbox with a dangerous tool (marked) and harmless ones, recording what ran."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, Any]] = []
        self.charge_started = trio.Event()
        self.toolbox = Toolbox()

        @self.toolbox.tool(needs_approval=True)
        async def send_mail(to: str) -> str:
            """Sends a mail."""
            self.ran.append(("send_mail", to))
            return f"sent to {to}"

        @self.toolbox.tool
        async def lookup(key: str) -> str:
            """Looks a key up."""
            self.ran.append(("lookup", key))
            return f"value of {key}"

        @self.toolbox.tool
        async def charge_card(amount: int) -> str:
            """Charges a card; never returns."""
            self.ran.append(("charge_card", amount))
            self.charge_started.set()
            await trio.sleep_forever()


async def _run(code_mode: CodeMode, source: str) -> str:
    """Run a cell as a model would: exec, then wait while it runs; every response's text."""
    output = await code_mode.exec("call-1", source)
    texts = [output.text]
    while output.status == "running":
        output = await code_mode.wait({"cell_id": output.cell_id})
        texts.append(output.text)
    return "\n".join(texts)


async def test_a_marked_tool_is_denied_without_an_approver(provider: Provider) -> None:
    tools = Tools()
    with trio.fail_after(BOUND):
        session = await provider.create_session()
        code_mode = CodeMode(session, tools.toolbox, tools.toolbox.definitions())
        text = await _run(
            code_mode,
            'try { await tools.send_mail({ to: "a@b" }); } catch (e) { text(e.message); }'
            ' text(await tools.lookup({ key: "k" }));',
        )
    assert text.endswith(f"tool tools.send_mail was denied: {NO_APPROVER}\nvalue of k")
    assert tools.ran == [("lookup", "k")]
    assert [(e.tool, e.outcome) for e in code_mode.journal("1")] == [
        ("send_mail", "denied"),
        ("lookup", "completed"),
    ]


async def test_a_toolbox_handed_to_a_session_ungoverned_still_refuses_a_marked_tool() -> None:
    tools = Tools()
    with trio.fail_after(BOUND):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            started = await session.execute(
                ExecuteRequest(
                    tool_call_id="c",
                    source='try { await tools.send_mail({ to: "x" }) } catch (e) { text(e.message) }',
                    enabled_tools=tools.toolbox.definitions(),
                ),
                tools.toolbox,
            )
            response = await started.initial_response()
    assert response.content_items[-1] == codemode.InputText(
        text=f"tool tools.send_mail was denied: {NO_APPROVER}"
    )
    assert tools.ran == []


@pytest.mark.parametrize("answer", ["approve", "deny"])
async def test_ask_then_approve_or_deny_while_sibling_calls_complete(
    provider: Provider, answer: str
) -> None:
    tools = Tools()
    asked: list[ApprovalRequest] = []
    decide = trio.Event()

    async def approver(request: ApprovalRequest) -> Verdict:
        asked.append(request)
        await decide.wait()  # the sibling call completes meanwhile
        return Approve() if answer == "approve" else Deny("the user said no")

    source = """
const [mail, value] = await Promise.allSettled([
  tools.send_mail({ to: "boss@example.com" }),
  tools.lookup({ key: "k" }).then((v) => { text("sibling done: " + v); return v; }),
]);
text(mail.status === "fulfilled" ? mail.value : mail.reason.message);
"""
    with trio.fail_after(BOUND):
        session = await provider.create_session()
        code_mode = CodeMode(session, tools.toolbox, tools.toolbox.definitions(), approver=approver)
        # The exec returns as the call starts waiting; the sibling call runs on meanwhile.
        first = await code_mode.exec("call-1", '// @exec: {"yield_time_ms": 60000}\n' + source)
        assert first.status == "running"
        assert "Waiting for approval of tools.send_mail (call 1)." in first.text.splitlines()
        while ("lookup", "k") not in tools.ran:
            await trio.testing.wait_all_tasks_blocked()
        decide.set()
        second = await code_mode.wait({"cell_id": first.cell_id, "yield_time_ms": 60000})
        assert second.status == "completed"
        result = [first.text + "\n" + second.text]
    (request,) = asked
    assert request.identifier == "send_mail"
    assert request.arguments == {"to": "boss@example.com"}
    assert request.call_id == "tool-1"
    assert request.source is not None
    assert "Promise.allSettled" in request.source
    lines = result[0].splitlines()
    assert "sibling done: value of k" in lines
    if answer == "approve":
        assert lines[-1] == "sent to boss@example.com"
        assert ("send_mail", "boss@example.com") in tools.ran
    else:
        assert lines[-1] == "tool tools.send_mail was denied: the user said no"
        assert ("send_mail", "boss@example.com") not in tools.ran


async def test_an_ask_that_times_out_is_denied() -> None:
    class AskBriefly(PolicyBase):
        async def decide(self, call: NestedToolCall) -> Decision:
            return Ask(timeout_s=0.05)

    async def never(request: ApprovalRequest) -> Verdict:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    tools = Tools()
    with trio.fail_after(BOUND):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            code_mode = CodeMode(
                session,
                tools.toolbox,
                tools.toolbox.definitions(),
                policy=AskBriefly(),
                approver=never,
            )
            first = await code_mode.exec(
                "call-1",
                '// @exec: {"yield_time_ms": 60000}\n'
                'try { await tools.lookup({ key: "k" }) } catch (e) { text(e.message) }',
            )
            assert first.status == "running"  # it returned as the call started waiting
            done = await code_mode.wait({"cell_id": first.cell_id, "yield_time_ms": 60000})
    assert done.text.endswith("tool tools.lookup was denied: no decision in time")
    assert tools.ran == []


async def test_hooks_rewrite_arguments_and_redact_results(provider: Provider) -> None:
    class Redacting(PolicyBase):
        async def decide(self, call: NestedToolCall) -> Decision:
            if call.input == {"key": "forbidden"}:
                return Deny("that key is off limits")
            return Allow()

        async def before_call(self, call: NestedToolCall) -> Any:
            return {"key": call.input["key"].lower()}  # a validated, normalised copy

        async def after_call(
            self, call: NestedToolCall, result: Any, error: BaseException | None
        ) -> Any:
            return result.replace("value", "[redacted]")

    tools = Tools()
    with trio.fail_after(BOUND):
        session = await provider.create_session()
        code_mode = CodeMode(
            session, tools.toolbox, tools.toolbox.definitions(), policy=Redacting()
        )
        text = await _run(
            code_mode,
            'text(await tools.lookup({ key: "LOUD" }));'
            ' try { await tools.lookup({ key: "forbidden" }) } catch (e) { text(e.message) }',
        )
    assert text.splitlines()[-2:] == [
        "[redacted] of loud",
        "tool tools.lookup was denied: that key is off limits",
    ]
    assert tools.ran == [("lookup", "loud")]


async def test_the_journal_and_the_models_line_after_a_terminate(provider: Provider) -> None:
    tools = Tools()
    with trio.fail_after(BOUND):
        session = await provider.create_session()
        code_mode = CodeMode(session, tools.toolbox, tools.toolbox.definitions())
        first = await code_mode.exec(
            "call-1",
            '// @exec: {"yield_time_ms": 0}\n'
            'await tools.lookup({ key: "a" }); await tools.charge_card({ amount: 5 });',
        )
        assert first.status == "running"
        await tools.charge_started.wait()
        stopped = await code_mode.wait({"cell_id": first.cell_id, "terminate": True})
    assert stopped.status == "terminated"
    assert stopped.text.splitlines()[-1] == (
        "Tool calls before the cell stopped: tools.lookup (call 1) completed;"
        " tools.charge_card (call 2) was running and may have taken effect."
    )
    journal = code_mode.journal(first.cell_id or "")
    assert [(e.tool, e.call_id, e.outcome) for e in journal] == [
        ("lookup", "tool-1", "completed"),
        ("charge_card", "tool-2", "cancelled while running"),
    ]
    assert all(e.ended is not None and e.ended >= e.started for e in journal)


async def test_a_raw_delegate_can_be_governed_too() -> None:
    class Plain:
        def __init__(self) -> None:
            self.calls: list[str] = []

        async def invoke_tool(self, call: NestedToolCall) -> Any:
            self.calls.append(call.tool_name.name)
            return "ok"

        async def notify(self, call_id: str, cell_id: str, text: str) -> None:
            pass

        def cell_closed(self, cell_id: str) -> None:
            pass

    class DenyDelete(PolicyBase):
        async def decide(self, call: NestedToolCall) -> Decision:
            return Deny("deleting is not allowed") if call.tool_name.name == "delete" else Allow()

    plain = Plain()
    definitions = [
        codemode.ToolDefinition(name=name, tool_name=codemode.ToolName(name=name))
        for name in ("delete", "read")
    ]
    delegate = governed(plain, policy=DenyDelete(), definitions=definitions)
    with trio.fail_after(BOUND):
        async with codemode.open_in_process_provider() as provider:
            session = await provider.create_session()
            started = await session.execute(
                ExecuteRequest(
                    tool_call_id="c",
                    source="try { await tools.delete({}) } catch (e) { text(e.message) }"
                    " text(await tools.read({}))",
                    enabled_tools=definitions,
                ),
                delegate,
            )
            response = await started.initial_response()
    texts = [item.text for item in response.content_items if isinstance(item, codemode.InputText)]
    assert texts == ["tool tools.delete was denied: deleting is not allowed", "ok"]
    assert plain.calls == ["read"]
    assert [e.outcome for e in delegate.journal("1")] == ["denied", "completed"]


def test_a_governed_delegate_takes_no_second_policy() -> None:
    tools = Tools()
    delegate = governed(tools.toolbox)

    class Session:  # never called: the constructor refuses first
        pass

    with pytest.raises(ValueError, match="the delegate is governed already"):
        CodeMode(Session(), delegate, [], policy=PolicyBase())  # type: ignore[arg-type]


def test_a_combined_toolbox_reports_its_sources_marks() -> None:
    tools = Tools()
    other = Toolbox()

    @other.tool
    def harmless() -> str:
        """Harmless."""
        return "ok"

    combined = codemode.combine(tools.toolbox, other)
    assert combined.needs_approval(codemode.ToolName(name="send_mail"))
    assert not combined.needs_approval(codemode.ToolName(name="harmless"))
    assert not combined.needs_approval(codemode.ToolName(name="missing"))


@pytest.mark.slow
async def test_a_destructive_mcp_tool_needs_approval() -> None:
    from codemode.mcp import open_mcp_toolbox
    from tests.mcp_servers import sdk_server_command

    asked: list[str] = []

    async def approver(request: ApprovalRequest) -> Verdict:
        asked.append(request.identifier)
        return Deny("not today")

    source = """
for (const attempt of [() => tools.mcp__test__wipe({}), () => tools.mcp__test__peek({})]) {
  try { text((await attempt()).content[0].text) } catch (e) { text(e.message) }
}
"""
    with trio.fail_after(BOUND):
        async with (
            open_mcp_toolbox({"test": sdk_server_command()}) as toolbox,
            codemode.open_in_process_provider() as provider,
        ):
            assert toolbox.needs_approval(codemode.ToolName.namespaced("mcp__test", "wipe"))
            assert not toolbox.needs_approval(codemode.ToolName.namespaced("mcp__test", "peek"))
            session = await provider.create_session()
            code_mode = CodeMode(session, toolbox, toolbox.definitions(), approver=approver)
            text = await _run(code_mode, source)
            # Handed to a session ungoverned, the toolbox still refuses the destructive tool.
            started = await session.execute(
                ExecuteRequest(
                    tool_call_id="c", source=source, enabled_tools=toolbox.definitions()
                ),
                toolbox,
            )
            ungoverned = await started.initial_response()
    assert asked == ["mcp__test__wipe"]
    assert text.splitlines()[-2:] == [
        "tool tools.mcp__test__wipe was denied: not today",
        "peek ran",
    ]
    assert [
        item.text for item in ungoverned.content_items if isinstance(item, codemode.InputText)
    ] == [
        f"tool tools.mcp__test__wipe was denied: {NO_APPROVER}",
        "peek ran",
    ]


@pytest.mark.slow
def test_the_approval_example_runs_offline() -> None:
    import subprocess
    import sys

    from tests.typecheck import ROOT

    finished = subprocess.run(
        [sys.executable, "-m", "examples.approval"],
        capture_output=True,
        text=True,
        timeout=BOUND,
        cwd=ROOT,
    )
    assert finished.returncode == 0, finished.stderr
    lines = finished.stdout.splitlines()
    assert "sent 'Your invoice' to ada@example.com" in lines
    assert "tool tools.send_mail was denied: the user declined" in lines
    assert "journal: tools.send_mail tool-4 denied" in lines


@pytest.mark.slow
@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("y", "sent 'hi' to ada@example.com"),
        ("n", "tool tools.send_mail was denied: the user declined"),
    ],
)
def test_codemode_run_asks_on_a_terminal(tmp_path: Any, typed: str, expected: str) -> None:
    """stdin is a pseudo-terminal, so `--approve` defaults to ask: the prompt goes to stderr,
    the answer is typed on the terminal, stdout holds what the model reads."""
    import os
    import pty
    import selectors
    import subprocess
    import sys
    from pathlib import Path

    from tests.typecheck import ROOT

    cell = tmp_path / "mail.js"
    cell.write_text(
        'try { text(await tools.send_mail({ to: "ada@example.com", subject: "hi" })) }'
        " catch (e) { text(e.message) }"
    )
    master, slave = pty.openpty()
    command = [str(Path(sys.executable).with_name("codemode")), "run", str(cell)]
    command += ["--tools", "examples.approval:toolbox", "--in-process"]
    process = subprocess.Popen(
        command, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    os.close(slave)
    try:
        assert process.stderr is not None
        seen = b""
        with selectors.DefaultSelector() as selector:
            selector.register(process.stderr, selectors.EVENT_READ)
            while b"[y/N] " not in seen:
                assert selector.select(timeout=BOUND), seen  # the prompt, not a sleep
                chunk = os.read(process.stderr.fileno(), 4096)
                assert chunk, seen
                seen += chunk
        assert seen.decode().startswith(
            'codemode: allow tools.send_mail({"to": "ada@example.com", "subject": "hi"})'
            " [tool-1 of cell 1]? [y/N] "
        )
        os.write(master, f"{typed}\n".encode())
        out, _ = process.communicate(timeout=BOUND)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert out.decode().splitlines()[-1] == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            (),
            "tool tools.send_mail was denied: it needs approval (run with --approve ask or --approve allow)",
        ),
        (("--approve", "allow"), "sent 'hi' to ada@example.com"),
        (
            ("--approve", "allow", "--deny", "send_*"),
            "tool tools.send_mail was denied: --deny send_*",
        ),
        (("--allow", "send_mail"), "sent 'hi' to ada@example.com"),
    ],
)
def test_codemode_run_without_a_terminal_denies_unless_told(
    tmp_path: Any, options: tuple[str, ...], expected: str
) -> None:
    import subprocess
    import sys
    from pathlib import Path

    from tests.typecheck import ROOT

    cell = tmp_path / "mail.js"
    cell.write_text(
        'try { text(await tools.send_mail({ to: "ada@example.com", subject: "hi" })) }'
        " catch (e) { text(e.message) }"
    )
    command = [str(Path(sys.executable).with_name("codemode")), "run", str(cell)]
    command += ["--tools", "examples.approval:toolbox", "--in-process", *options]
    finished = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=BOUND, cwd=ROOT
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.splitlines()[-1] == expected
    assert finished.stderr == ""  # no prompt without a terminal


async def test_an_observation_returns_when_a_call_starts_waiting_and_terminate_cancels_it(
    provider: Provider,
) -> None:
    tools = Tools()
    asked = trio.Event()
    cancelled: list[str] = []

    async def approver(request: ApprovalRequest) -> Verdict:
        asked.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(request.call_id)  # the application sees its request cancelled
            raise
        raise AssertionError("unreachable")

    with trio.fail_after(BOUND):
        session = await provider.create_session()
        code_mode = CodeMode(session, tools.toolbox, tools.toolbox.definitions(), approver=approver)
        # A long window: only the wait for approval makes the observation return early.
        first = await code_mode.exec(
            "call-1",
            '// @exec: {"yield_time_ms": 60000}\n'
            'text("before"); await tools.send_mail({ to: "x@y" }); text("after");',
        )
        assert first.status == "running"
        assert first.text.splitlines()[4:] == [
            "Waiting for approval of tools.send_mail (call 1).",
            "before",
        ]
        assert [e.outcome for e in code_mode.journal(first.cell_id or "")] == [
            "waiting for approval"
        ]
        stopped = await code_mode.wait({"cell_id": first.cell_id, "terminate": True})
    assert stopped.status == "terminated"
    assert cancelled == ["tool-1"]
    assert [e.outcome for e in code_mode.journal(first.cell_id or "")] == [
        "cancelled before it started"
    ]
    assert tools.ran == []


@pytest.mark.slow
async def test_a_call_running_when_its_host_is_killed_is_journaled_unknown() -> None:
    import os
    import signal

    tools = Tools()
    with trio.fail_after(BOUND):
        async with codemode.open_process_provider() as provider:
            session = await provider.create_session()
            code_mode = CodeMode(session, tools.toolbox, tools.toolbox.definitions())
            first = await code_mode.exec(
                "call-1",
                '// @exec: {"yield_time_ms": 0}\n'
                'await tools.lookup({ key: "a" }); await tools.charge_card({ amount: 5 });',
            )
            await tools.charge_started.wait()
            (host,) = provider.statistics().hosts
            assert host.pid is not None
            os.kill(host.pid, signal.SIGKILL)
            lost = await code_mode.wait({"cell_id": first.cell_id})
    assert lost.status == "error"
    assert lost.text.splitlines()[-1] == (
        "Tool calls before the cell stopped: tools.lookup (call 1) completed;"
        " tools.charge_card (call 2) was running and may have taken effect."
    )
    assert [(e.tool, e.outcome) for e in code_mode.journal(first.cell_id or "")] == [
        ("lookup", "completed"),
        ("charge_card", "unknown: the host was lost while it ran"),
    ]


@pytest.mark.parametrize("action", ["accept", "decline", None])
async def test_mcp_serve_asks_its_client_with_an_elicitation(
    action: Literal["accept", "decline"] | None,
) -> None:
    """`codemode mcp serve`'s service asks the MCP client's user about a marked tool; a client
    without elicitation gets a denial naming why."""
    import mcp_types as types
    from mcp import Client

    from codemode.mcp._serve import open_code_mode_service

    tools = Tools()
    messages: list[str] = []

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        messages.append(params.message)
        return types.ElicitResult(action=action or "cancel")

    source = 'try { text(await tools.send_mail({ to: "a@b" })) } catch (e) { text(e.message) }'
    callback = None if action is None else elicit
    with trio.fail_after(BOUND):
        async with (
            codemode.open_in_process_provider() as provider,
            open_code_mode_service(provider, tools.toolbox) as service,
            Client(service.server(), mode="legacy", elicitation_callback=callback) as client,
        ):
            result = await client.call_tool("exec", {"code": source})
            text = "".join(b.text for b in result.content if isinstance(b, types.TextContent))
            while "Script running" in text:
                cell_id = text.split("cell ID ")[1].split()[0]
                result = await client.call_tool("wait", {"cell_id": cell_id})
                text = "".join(b.text for b in result.content if isinstance(b, types.TextContent))
    last = text.splitlines()[-1]
    if action == "accept":
        assert messages == ['Allow tools.send_mail({"to": "a@b"}) (tool-1 of exec cell 1)?']
        assert last == "sent to a@b"
    elif action == "decline":
        assert last == "tool tools.send_mail was denied: the MCP client's user chose decline"
    else:
        assert last == (
            "tool tools.send_mail was denied: the MCP client cannot be asked"
            " (it does not support elicitation)"
        )


async def test_the_session_lists_a_call_waiting_for_approval_and_its_time_limit_pauses(
    provider: Provider,
) -> None:
    """The runtime learns of the wait (in-process directly, a host through `delegate/waiting`):
    `Session.cells()` names the call, and a wall-clock limit shorter than the wait does not end
    the cell while only that call is pending."""
    tools = Tools()
    asked = trio.Event()
    decide = trio.Event()

    async def approver(request: ApprovalRequest) -> Verdict:
        asked.set()
        await decide.wait()
        return Approve()

    with trio.fail_after(BOUND):
        session = await provider.create_session(codemode.CellLimits(max_wall_time_ms=1000))
        code_mode = CodeMode(session, tools.toolbox, tools.toolbox.definitions(), approver=approver)
        first = await code_mode.exec("call-1", 'text(await tools.send_mail({ to: "a@b" }));')
        assert first.status == "running"
        await asked.wait()
        while True:
            (cell,) = await session.cells()
            if cell.waiting_for_approval:
                break
            await trio.testing.wait_all_tasks_blocked()
        assert cell.waiting_for_approval == ["tool-1"]
        # Well past the 1 s limit, the cell still runs: its time is paused. (Not a
        # synchronisation: the time the limit must not count is the point of the test.)
        await trio.sleep(1.5)
        (cell,) = await session.cells()
        assert cell.phase == "running"
        decide.set()
        done = await code_mode.wait({"cell_id": first.cell_id, "yield_time_ms": 60000})
    assert done.status == "completed", done.text
    assert done.text.splitlines()[-1] == "sent to a@b"


@pytest.mark.parametrize(
    ("limits", "busy", "first_line"),
    [
        (
            codemode.CellLimits(max_cpu_time_ms=200),
            "while (true) {}",
            "exec cell exceeded its CPU time limit of 200 ms",
        ),
        (
            codemode.CellLimits(max_wall_time_ms=300),
            "await new Promise(() => {})",
            "exec cell exceeded its time limit of 300 ms",
        ),
    ],
    ids=["cpu-limit", "wall-time-limit"],
)
async def test_the_models_line_after_a_limit_cut_the_cell_short(
    provider: Provider, limits: codemode.CellLimits, busy: str, first_line: str
) -> None:
    tools = Tools()
    with trio.fail_after(BOUND):
        session = await provider.create_session(limits)
        code_mode = CodeMode(session, tools.toolbox, tools.toolbox.definitions())
        output = await code_mode.exec(
            "call-1",
            '// @exec: {"yield_time_ms": 60000}\n'
            f'await tools.lookup({{ key: "a" }}); text("looked up"); {busy}',
        )
    assert output.status == "failed"
    lines = output.text.splitlines()
    assert lines[-3:] == [
        "Script error:",
        first_line,
        "Tool calls before the cell stopped: tools.lookup (call 1) completed.",
    ]
    assert [(e.tool, e.outcome) for e in code_mode.journal(output.cell_id or "")] == [
        ("lookup", "completed")
    ]
