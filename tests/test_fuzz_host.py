"""Wire fuzzing of a real host process (hypothesis, each example under `trio.fail_after`).

Each example starts a host, (usually) shakes hands, and sends a random mix of: frames of random
bytes, valid frames whose fields have the wrong types, well-typed requests naming unknown or
random sessions and cells with random (so sometimes duplicate) ids, cancels and delegate
answers nobody asked for, and a second hello; then one of: a probe (open a session, run a
trivial cell), a truncated frame, an oversized length prefix, or random bytes, and EOF.

The host must answer with errors or close that connection cleanly: it exits with status 0 or
1 (never a signal), writes only decodable frames, logs no traceback, and never hangs. When the
connection is still open the probe must complete on it; when the host closed it, a fresh
host (a fresh connection) must complete the probe.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
import trio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import codemode
from codemode import Completed, ExecuteRequest, InputText, WaitRequest
from codemode.protocol import (
    MAX_FRAME_BYTES,
    DelegateResponse,
    Err,
    Execute,
    ExecutionStarted,
    FrameDecoder,
    FrameEncoder,
    Hello,
    HostMessage,
    InitialResponse,
    NotificationDelivered,
    Ok,
    OpenSession,
    OperationCancel,
    OperationRequest,
    OperationResponse,
    Ready,
    SessionReady,
    ShutdownSession,
    Terminate,
    ToolResult,
    Wait,
)
from tests.frames import receive_message

EXAMPLES = int(os.environ.get("CODEMODE_FUZZ_EXAMPLES", "40"))
"""Examples per fuzz test: 40 in the suite, more with `nox -s fuzz`."""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    # No explain phase: it re-runs a failing example hundreds of times (minutes of hosts).
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    # A fixed sequence in the suite (a failure reproduces on every run); `nox -s fuzz` explores.
    derandomize="CODEMODE_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow],
)
EXAMPLE_BOUND = 20.0
"""Seconds one example may take, host start and exit included (usually well under one)."""

HELLO = Hello(supported_versions=[1])
PROBE_SESSION = "probe-session"
PROBE_ID = 1 << 40
"""Request ids of the probe: above any the fuzz draws, so never a duplicate."""

_encoder = FrameEncoder()


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "little") + payload


def encoded(message: object) -> bytes:
    return _encoder.encode(message)


# ---- strategies ----------------------------------------------------------------------------

ids = st.integers(min_value=1, max_value=12)
sessions = st.sampled_from(["s1", "s2", "unknown", PROBE_SESSION, ""])
cells = st.sampled_from(["1", "2", "g2:1", "nope", ""])
sources = st.sampled_from(
    ["text(1)", "await new Promise(() => {})", "while (true) {}", "notify('n')", "syntax error(",
     "await tools.x({})", "store('k', 1); text(load('k'))", "exit()", "yield_control()"]
)  # fmt: skip
small_yield = st.integers(min_value=0, max_value=50)

requests = st.one_of(
    st.builds(lambda s: OpenSession(session_id=s), st.sampled_from(["s1", "s2"])),
    st.builds(
        lambda s, source, y: Execute(
            session_id=s,
            request=ExecuteRequest(tool_call_id="call", source=source, yield_time_ms=y),
        ),
        sessions.filter(bool),
        sources,
        small_yield,
    ),
    st.builds(
        lambda s, c, y: Wait(session_id=s, request=WaitRequest(cell_id=c, yield_time_ms=y)),
        sessions.filter(bool),
        cells,
        small_yield,
    ),
    st.builds(lambda s, c: Terminate(session_id=s, cell_id=c), sessions.filter(bool), cells),
    st.builds(lambda s: ShutdownSession(session_id=s), sessions.filter(bool)),
)

typed_messages = st.one_of(
    st.builds(lambda i, r: OperationRequest(id=i, request=r), ids, requests),
    st.builds(lambda i: OperationCancel(id=i), ids),
    st.builds(lambda i: DelegateResponse(id=i, result=Ok(value=NotificationDelivered())), ids),
    st.builds(lambda i: DelegateResponse(id=i, result=Ok(value=ToolResult(result=1))), ids),
    st.just(HELLO),
)

anything = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a field of a decoded message (the tags included)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _paths(inner, (*prefix, index))
    return found


@st.composite
def wrong_types(draw: st.DrawFn) -> bytes:
    """A valid message with one field (or tag) replaced by a value of any type."""
    message = draw(typed_messages)
    tree = msgspec.to_builtins(message)
    path = draw(st.sampled_from(_paths(tree)))
    *parents, last = path
    holder = tree
    for key in parents:
        holder = holder[key]
    holder[last] = draw(anything)
    return frame(msgspec.msgpack.encode(tree))


actions = st.one_of(
    st.builds(frame, st.binary(max_size=64)),
    typed_messages.map(encoded),
    wrong_types(),
)

truncated = typed_messages.flatmap(
    lambda m: st.integers(1, len(encoded(m)) - 1).map(lambda cut: encoded(m)[:cut])
)
oversized = st.integers(MAX_FRAME_BYTES + 1, 2**32 - 1).map(lambda n: n.to_bytes(4, "little"))
endings = st.one_of(
    st.just(b""),  # b"" is the probe
    truncated,
    oversized,
    st.binary(min_size=1, max_size=64),
)


# ---- driving a host ------------------------------------------------------------------------


@dataclass
class Host:
    process: trio.Process
    decoder: FrameDecoder[HostMessage] = field(
        default_factory=lambda: FrameDecoder(HostMessage)  # type: ignore[arg-type]
    )
    stderr: bytearray = field(default_factory=bytearray)

    async def send(self, data: bytes) -> bool:
        """Send `data`; False when the host already closed its stdin (it left the connection)."""
        assert self.process.stdin is not None
        try:
            await self.process.stdin.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    async def receive(self) -> HostMessage | None:
        assert self.process.stdout is not None
        return await receive_message(self.process.stdout, self.decoder)

    async def collect_stderr(self) -> None:
        assert self.process.stderr is not None
        while chunk := await self.process.stderr.receive_some(65536):
            self.stderr += chunk


async def _exercise(body: Any) -> tuple[int, str]:
    """Start a host, run `body(host)`, close its stdin, read it to the end; its exit status
    and stderr."""
    process = await trio.lowlevel.open_process(
        codemode.default_host_command(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    host = Host(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(host.collect_stderr)
            await body(host)
            assert process.stdin is not None
            await process.stdin.aclose()
            while await host.receive() is not None:
                pass  # every frame the host writes decodes, to its very end
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
    status = process.returncode
    assert status is not None
    return status, host.stderr.decode(errors="replace")


async def _probe(host: Host) -> bool:
    """Open a session and run `text("alive")` on this connection: True when it completed,
    False when the host closed the connection instead."""
    opened = await _answer(host, PROBE_ID, OpenSession(session_id=PROBE_SESSION))
    if opened is None:
        return False
    assert isinstance(opened, OperationResponse), opened
    if isinstance(opened.result, Err):
        # The fuzz took the probe's session id: the host answered with an error, which shows
        # that the connection serves; a fresh host runs the cell.
        assert opened.result.kind == "invalid_request", opened
        await _fresh_probe()
        return True
    request = ExecuteRequest(tool_call_id="probe", source='text("alive")')
    started = await _answer(host, PROBE_ID + 1, Execute(session_id=PROBE_SESSION, request=request))
    if started is None:
        return False
    assert started.result == Ok(value=ExecutionStarted(cell_id=started.result.value.cell_id)), (
        started
    )
    response = await _answer(host, PROBE_ID + 1, None, initial=True)
    if response is None:
        return False
    assert isinstance(response.result, Ok), response
    assert isinstance(response.result.value, Completed), response
    assert response.result.value.content_items == [InputText(text="alive")]
    return True


async def _answer(host: Host, request_id: int, request: Any, *, initial: bool = False) -> Any:
    """Send `request` (unless None) as `request_id` and return its answer (the initial
    response when `initial`), skipping the fuzz's own traffic; None at EOF."""
    if request is not None and not await host.send(
        encoded(OperationRequest(id=request_id, request=request))
    ):
        return None
    kind = InitialResponse if initial else OperationResponse
    while (message := await host.receive()) is not None:
        if isinstance(message, kind) and message.id == request_id:
            return message
    return None


async def _fresh_probe() -> None:
    async def body(host: Host) -> None:
        assert await host.send(encoded(HELLO))
        assert isinstance(await host.receive(), Ready)
        assert await _probe(host)

    status, stderr = await _exercise(body)
    assert status == 0, stderr


def _clean_exit(status: int, stderr: str) -> None:
    assert status in (0, 1), f"host exit status {status}\n{stderr}"
    assert "Traceback" not in stderr, stderr


STATISTICS = {
    "examples": 0,
    "probed on the same connection": 0,
    "closed by the host": 0,
    "well-typed examples": 0,
}


@pytest.mark.slow
@FUZZ
@given(
    handshake=st.booleans() | st.just(True),
    sent=st.lists(actions, max_size=8),
    ending=endings,
)
async def test_the_host_survives_whatever_a_client_sends(
    handshake: bool, sent: list[bytes], ending: bytes
) -> None:
    alive = False

    async def body(host: Host) -> None:
        nonlocal alive
        if handshake:
            assert await host.send(encoded(HELLO))
            assert isinstance(await host.receive(), Ready)
        if not await host.send(b"".join(sent)):
            return
        if ending:
            await host.send(ending)
        else:
            alive = await _probe(host)

    with trio.fail_after(EXAMPLE_BOUND):
        started = trio.current_time()
        status, stderr = await _exercise(body)
        took = trio.current_time() - started
        if took > 2:
            print(f"slow example ({took:.1f} s, status {status}): {handshake} {sent} {ending!r}")
        _clean_exit(status, stderr)
        STATISTICS["examples"] += 1
        if alive:
            STATISTICS["probed on the same connection"] += 1
            assert status == 0, stderr
        else:
            STATISTICS["closed by the host"] += 1
            await _fresh_probe()


@pytest.mark.slow
@FUZZ
@given(
    steps=st.lists(
        st.tuples(
            st.one_of(
                requests,
                st.builds(lambda i: OperationCancel(id=i), ids),
                st.builds(
                    lambda i: DelegateResponse(id=i, result=Ok(value=NotificationDelivered())), ids
                ),
            ),
            st.booleans(),
        ),
        max_size=10,
    )
)
async def test_well_typed_nonsense_gets_answers_and_the_connection_serves(
    steps: list[tuple[Any, bool]],
) -> None:
    """Unknown sessions and cells, waits and terminates of cells that never existed, shutdowns
    of sessions never opened, cancels and delegate answers nobody asked for, requests sent
    out of order: each gets an answer (or is ignored) and the same connection still serves."""
    alive = False

    async def body(host: Host) -> None:
        nonlocal alive
        assert await host.send(encoded(HELLO))
        assert isinstance(await host.receive(), Ready)
        # s1 is open, so that executes, waits and terminates also reach real cells.
        opened = await _answer(host, PROBE_ID - 1, OpenSession(session_id="s1"))
        assert opened is not None
        assert opened.result == Ok(value=SessionReady(session_id="s1"))
        for request_id, (message, wait) in enumerate(steps, start=1):
            if isinstance(message, OperationCancel | DelegateResponse):
                assert await host.send(encoded(message))
                continue
            answer = await _answer(host, request_id, message) if wait else None
            if not wait:
                operation = OperationRequest(id=request_id, request=message)
                assert await host.send(encoded(operation))
            elif answer is not None:
                ANSWERS[_kind(answer.result)] = ANSWERS.get(_kind(answer.result), 0) + 1
        alive = await _probe(host)

    with trio.fail_after(EXAMPLE_BOUND):
        status, stderr = await _exercise(body)
    assert alive, stderr
    assert status == 0, stderr
    STATISTICS["well-typed examples"] += 1


def _kind(result: object) -> str:
    return type(result.value).__name__ if isinstance(result, Ok) else str(result.kind)  # type: ignore[attr-defined]


ANSWERS: dict[str, int] = {}


def test_fuzz_figures() -> None:
    """What the fuzz above did (run after it, in file order): each test ran as many examples as
    it is set to; every example of the first ended one way or the other, and both ways
    happened (a connection still serving the probe, a connection the host closed); the
    well-typed requests got both kinds of answer (refusals, and cells really started)."""
    print(f"host wire fuzz: {STATISTICS}; answers to well-typed requests: {ANSWERS}")
    examples, well_typed = STATISTICS["examples"], STATISTICS["well-typed examples"]
    if examples == well_typed == 0:
        pytest.skip("the fuzz tests did not run in this session")
    if examples:
        probed = STATISTICS["probed on the same connection"]
        closed = STATISTICS["closed by the host"]
        assert examples >= EXAMPLES, STATISTICS
        assert probed + closed == examples, STATISTICS
        assert probed >= 1, STATISTICS
        assert closed >= 1, STATISTICS
    if well_typed:
        assert well_typed >= EXAMPLES, STATISTICS
        assert ANSWERS.get("invalid_request", 0) >= 1, ANSWERS
        assert ANSWERS.get("ExecutionStarted", 0) >= 1, ANSWERS
