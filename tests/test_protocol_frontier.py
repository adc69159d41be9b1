"""The pending frontier and preempt on the sans-IO connections (an in-memory pair).

Frames (`session/executeToPending`, `session/waitToPending`, `operation/yield`), their
capabilities, the answers only a frontier observation may get, and a retired frontier parked for
the next observation.
"""

from __future__ import annotations

import pytest

from codemode import ExecuteRequest, InputText, LiveCell, Pending, Yielded
from codemode.protocol import (
    CAPABILITIES,
    Answered,
    Err,
    ErrorKind,
    ExecuteToPending,
    ExecutionStarted,
    HostResponse,
    InitialAnswered,
    Ok,
    OperationRequest,
    OperationYield,
    PreemptRequested,
    RemoteProtocolError,
    RequestReceived,
    SessionReady,
    Wait,
    WaitCompleted,
    WaitToPending,
)
from tests.protocol_pair import Pair

REQUEST = ExecuteRequest(tool_call_id="call-1", source="await tools.t({})")


def opened(*, capabilities: tuple[str, ...] = CAPABILITIES) -> Pair:
    pair = Pair(capabilities=capabilities)
    pair.flush()
    pair.client.open_session("s", None)
    (request,) = [e for e in pair.to_host() if isinstance(e, RequestReceived)]
    pair.host.respond(request.request_id, Ok(value=SessionReady(session_id="s")))
    pair.to_client()
    return pair


def started_to_pending(pair: Pair) -> int:
    rid = pair.client.execute("s", REQUEST, to_pending=True)
    (request,) = [e for e in pair.to_host() if isinstance(e, RequestReceived)]
    assert isinstance(request.request, ExecuteToPending)
    pair.host.respond(rid, Ok(value=ExecutionStarted(cell_id="1")))
    pair.to_client()
    pair.client.take_initial(rid)
    return rid


def frontier(items: list[str], ids: list[str]) -> Pending:
    return Pending(
        cell_id="1",
        content_items=[InputText(text=text) for text in items],
        pending_tool_call_ids=ids,
    )


def waited(response: Pending | Yielded) -> Ok[HostResponse]:
    answer: Ok[HostResponse] = Ok(value=WaitCompleted(outcome=LiveCell(response=response)))
    return answer


def test_an_execute_to_pending_is_answered_with_its_frontier() -> None:
    pair = opened()
    rid = started_to_pending(pair)
    pair.host.respond_initial(rid, Ok(value=frontier(["a"], ["tool-1"])))
    assert pair.to_client() == [
        InitialAnswered(request_id=rid, result=Ok(value=frontier(["a"], ["tool-1"])))
    ]


def test_a_parked_frontier_answers_the_next_frontier_observation_without_a_frame() -> None:
    pair = opened()
    rid = started_to_pending(pair)
    pair.host.respond_initial(rid, Ok(value=frontier([], ["tool-1"])))
    pair.to_client()
    wait = pair.client.wait("s", "1", None)
    pair.to_host()
    assert pair.client_frames[-1] == OperationRequest(
        id=wait, request=WaitToPending(session_id="s", cell_id="1")
    )
    pair.client.cancel(wait)
    pair.to_host()
    # The host delivered the next frontier before the cancel arrived: it is parked.
    pair.host.respond(wait, waited(frontier(["b"], ["tool-2"])))
    assert pair.to_client() == []
    sent = len(pair.client_frames)
    again = pair.client.wait("s", "1", None)
    assert pair.client_events_now() == [
        Answered(request_id=again, result=waited(frontier(["b"], ["tool-2"])))
    ]
    pair.to_host()
    assert len(pair.client_frames) == sent  # the host keeps the cell paused: nothing to ask


def test_a_plain_wait_after_a_parked_frontier_gets_its_output_and_resumes_the_cell() -> None:
    pair = opened()
    rid = started_to_pending(pair)
    pair.host.respond_initial(rid, Ok(value=frontier([], ["tool-1"])))
    pair.to_client()
    wait = pair.client.wait("s", "1", None)
    pair.to_host()
    pair.client.cancel(wait)
    pair.to_host()
    pair.host.respond(wait, waited(frontier(["b"], ["tool-2"])))
    pair.to_client()
    plain = pair.client.wait("s", "1", 10)
    pair.to_host()
    assert isinstance(pair.client_frames[-1], OperationRequest)
    assert isinstance(pair.client_frames[-1].request, Wait)
    pair.host.respond(plain, waited(Yielded(cell_id="1", content_items=[InputText(text="c")])))
    assert pair.to_client() == [
        Answered(
            request_id=plain,
            result=waited(
                Yielded(cell_id="1", content_items=[InputText(text="b"), InputText(text="c")])
            ),
        )
    ]


@pytest.mark.parametrize("frontier_observer", [True, False], ids=["yielded", "pending"])
def test_only_frontier_observations_get_a_pending_and_never_a_yield(
    frontier_observer: bool,
) -> None:
    pair = opened()
    rid = started_to_pending(pair)
    pair.host.respond_initial(rid, Ok(value=frontier([], [])))
    pair.to_client()
    wait = pair.client.wait("s", "1", None if frontier_observer else 10)
    pair.to_host()
    wrong = Yielded(cell_id="1", content_items=[]) if frontier_observer else frontier([], [])
    pair.host.respond(wait, waited(wrong))
    with pytest.raises(RemoteProtocolError, match="observer"):
        pair.to_client()


def test_preempt_targets_the_cells_plain_observation() -> None:
    pair = opened()
    rid = pair.client.execute("s", REQUEST)
    pair.to_host()
    pair.host.respond(rid, Ok(value=ExecutionStarted(cell_id="1")))
    pair.to_client()
    pair.client.preempt("s", "1")  # the initial observation, even before it is awaited
    events = pair.to_host()
    assert pair.client_frames[-1] == OperationYield(id=rid)
    assert events == [PreemptRequested(request_id=rid)]
    pair.host.respond_initial(rid, Ok(value=Yielded(cell_id="1", content_items=[])))
    pair.client.take_initial(rid)
    pair.to_client()
    sent = len(pair.client_frames)
    pair.client.preempt("s", "1")  # nothing observes the cell: no frame
    pair.client.preempt("s", "unknown")
    pair.to_host()
    assert len(pair.client_frames) == sent


def test_a_frontier_observation_is_not_preempted() -> None:
    pair = opened()
    rid = started_to_pending(pair)
    sent = len(pair.client_frames)
    pair.client.preempt("s", "1")
    pair.to_host()
    assert len(pair.client_frames) == sent
    # A client that sends one anyway: the host ignores it for a frontier execute.
    pair.client._queue(OperationYield(id=rid))
    assert pair.to_host() == []


def test_frontier_requests_need_their_capability() -> None:
    pair = opened(capabilities=())
    rid = pair.client.execute("s", REQUEST, to_pending=True)
    assert pair.to_host() == []
    assert pair.to_client() == [
        Answered(
            request_id=rid,
            result=Err(
                kind=ErrorKind.INVALID_REQUEST,
                message="code-mode pending frontier requests need the `pending-frontier`"
                " capability",
            ),
        )
    ]


def test_a_yield_without_its_capability_breaks_the_connection() -> None:
    pair = opened(capabilities=())
    pair.client._queue(OperationYield(id=1))
    with pytest.raises(RemoteProtocolError, match="yield-observation"):
        pair.to_host()
