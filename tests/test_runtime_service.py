"""Session behaviour through the public API: design.md, runtime 9.1 to 9.3 (service, contract
and session-runtime tests). The pending-frontier tests (`execute_to_pending_*`,
`wait_to_pending_*`) are in `test_pending_frontier.py`."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from codemode import (
    Completed,
    ContentItem,
    ImageDetail,
    InputImage,
    InputText,
    LiveCell,
    MissingCell,
    Session,
    Terminated,
    WaitRequest,
    Yielded,
)
from codemode.errors import (
    AlreadyTerminatingError,
    CodeModeError,
    ObserverBusyError,
    SessionShuttingDownError,
)
from tests.conftest import Provider
from tests.delegates import RecordingDelegate
from tests.sessions import LONG_MS, execute, run, texts, tool

REMOTE_IMAGE_ERROR = (
    "Tool call failed: remote image URLs are not supported in tool outputs."
    " Pass a base64 data URI instead"
)

pytestmark = pytest.mark.usefixtures("provider")


# ---- 9.1 ---------------------------------------------------------------------------------


async def test_synchronous_exit_returns_successfully(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        response = await run(session, delegate, 'text("before"); exit(); text("after")')
    assert response == Completed(cell_id="1", content_items=[InputText(text="before")])


async def test_stored_values_are_shared_between_cells_but_not_sessions(
    provider: Provider, session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        await run(session, delegate, 'store("key", "visible")')
        second = await run(session, delegate, 'text(load("key"))')
        other = await provider.create_session()
        third = await run(other, delegate, 'text(load("key"))')
    assert texts(second) == ["visible"]
    assert third.cell_id == "1"
    assert texts(third) == ["undefined"]


async def test_shutdown_interrupts_cpu_bound_cells(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        response = await run(session, delegate, "while (true) {}", yield_time_ms=1)
    assert response == Yielded(cell_id="1", content_items=[])
    with trio.fail_after(1):
        await session.shutdown()
    assert delegate.closed == ["1"]


async def test_start_cell_rejects_new_cell_after_shutdown_begins(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        await session.shutdown()
        with pytest.raises(SessionShuttingDownError, match=r"^code mode session is shutting down$"):
            await execute(session, delegate, "1")
    assert session.is_alive is False


async def test_console_is_not_exposed_on_global_this(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        response = await run(session, delegate, 'text(Object.hasOwn(globalThis, "console"))')
    assert texts(response) == ["false"]


async def test_output_helpers_return_undefined(
    session: Session, delegate: RecordingDelegate
) -> None:
    source = """
        const results = [
          text("hello"),
          image("data:image/png;base64,AAA"),
          notify("ping"),
        ];
        text(JSON.stringify(results.map((r) => r === undefined)));
    """
    with trio.fail_after(10):
        response = await run(session, delegate, source)
        await delegate.until(lambda: len(delegate.notifications) == 1)
    assert response == Completed(
        cell_id="1",
        content_items=[
            InputText(text="hello"),
            InputImage(image_url="data:image/png;base64,AAA", detail=ImageDetail.HIGH),
            InputText(text="[true,true,true]"),
        ],
    )
    assert delegate.notifications == [("call-1", "1", "ping")]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(
            'image({ type: "image", data: "AAA", mimeType: "image/png", _meta: { "codex/imageDetail": "original" } })',
            [InputImage(image_url="data:image/png;base64,AAA", detail=ImageDetail.ORIGINAL)],
            id="image_helper_accepts_raw_mcp_image_block_with_original_detail",
        ),
        pytest.param(
            'generatedImage({ image_url: "data:image/png;base64,AAA", output_hint: "a hint" })',
            [
                InputImage(image_url="data:image/png;base64,AAA", detail=ImageDetail.HIGH),
                InputText(text="a hint"),
            ],
            id="generated_image_helper_appends_image_and_output_hint",
        ),
        pytest.param(
            'image({ image_url: "data:image/png;base64,AAA", detail: "high" }, "original")',
            [InputImage(image_url="data:image/png;base64,AAA", detail=ImageDetail.ORIGINAL)],
            id="image_helper_second_arg_overrides_explicit_object_detail",
        ),
        pytest.param(
            'image({ type: "image", data: "AAA", mimeType: "image/png", _meta: { "codex/imageDetail": "original" } }, "high")',
            [InputImage(image_url="data:image/png;base64,AAA", detail=ImageDetail.HIGH)],
            id="image_helper_second_arg_overrides_raw_mcp_image_detail",
        ),
        pytest.param(
            'image("data:image/png;base64,AAA", "low")',
            [InputImage(image_url="data:image/png;base64,AAA", detail=ImageDetail.LOW)],
            id="image_helper_accepts_low_detail",
        ),
    ],
)
async def test_image_helpers(
    session: Session, delegate: RecordingDelegate, source: str, expected: list[ContentItem]
) -> None:
    with trio.fail_after(10):
        response = await run(session, delegate, source)
    assert response == Completed(cell_id="1", content_items=expected)


@pytest.mark.parametrize(
    ("source", "error"),
    [
        pytest.param(
            'image("https://example.com/image.png")', REMOTE_IMAGE_ERROR, id="image-https"
        ),
        pytest.param('image("http://example.com/image.png")', REMOTE_IMAGE_ERROR, id="image-http"),
        pytest.param(
            'generatedImage({ image_url: "https://example.com/image.png" })',
            REMOTE_IMAGE_ERROR,
            id="generated-image-https",
        ),
        pytest.param(
            'image("data:image/png;base64,AAA", "medium")',
            "image detail must be one of: auto, low, high, original",
            id="image_helper_rejects_unsupported_detail",
        ),
        pytest.param(
            'image({ content: [{ type: "image", data: "AAA", mimeType: "image/png" }], isError: false })',
            "image expects a non-empty image URL string, an object with image_url and optional"
            " detail, or a raw MCP image block",
            id="image_helper_rejects_raw_mcp_result_container",
        ),
    ],
)
async def test_image_helpers_reject(
    session: Session, delegate: RecordingDelegate, source: str, error: str
) -> None:
    """Includes image_helpers_reject_remote_urls."""
    with trio.fail_after(10):
        response = await run(session, delegate, source)
    assert response == Completed(cell_id="1", content_items=[], error_text=error)


async def test_wait_reports_missing_cell_separately_from_runtime_results(session: Session) -> None:
    with trio.fail_after(10):
        outcome = await session.wait(WaitRequest(cell_id="missing", yield_time_ms=1))
    assert outcome == MissingCell(
        response=Completed(
            cell_id="missing", content_items=[], error_text="exec cell missing not found"
        )
    )


# ---- 9.2 ---------------------------------------------------------------------------------


async def test_yields_and_resumes(session: Session, delegate: RecordingDelegate) -> None:
    with trio.fail_after(10):
        first = await run(session, delegate, 'text("before"); yield_control(); text("after")')
        second = await session.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
    assert first == Yielded(cell_id="1", content_items=[InputText(text="before")])
    assert second == LiveCell(
        response=Completed(cell_id="1", content_items=[InputText(text="after")])
    )


async def test_observed_natural_completion_wins_over_termination(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        first = await run(
            session, delegate, 'yield_control(); store("finished", true); text("done")'
        )
        assert first == Yielded(cell_id="1", content_items=[])
        # The cell completes unobserved; later cells see its stored value once it committed
        # (the JS runs on an engine thread: poll with probe cells).
        while texts(await run(session, delegate, 'text(load("finished"))')) != ["true"]:
            pass
        outcome = await session.terminate("1")
        await delegate.until(lambda: "1" in delegate.closed)
    assert outcome == LiveCell(
        response=Completed(cell_id="1", content_items=[InputText(text="done")])
    )


async def test_termination_cancels_pending_callbacks_before_responding(
    session: Session, delegate: RecordingDelegate
) -> None:
    delegate.hold_notifications = True
    with trio.fail_after(10):
        await execute(
            session,
            delegate,
            'notify("pending"); await new Promise(() => {})',
            observe_initial=False,
        )
        await delegate.until(lambda: len(delegate.notifications) == 1)
        outcome = await session.terminate("1")
        assert delegate.cancelled_notifications == ["pending"]
        await delegate.until(lambda: delegate.closed == ["1"])
    assert outcome == LiveCell(response=Terminated(cell_id="1", content_items=[]))


async def test_shutdown_cancels_notifications_while_natural_completion_is_draining(
    session: Session, delegate: RecordingDelegate
) -> None:
    delegate.hold_notifications = True
    with trio.fail_after(10):
        started = await execute(session, delegate, 'notify("held"); text("done")')
        await delegate.until(lambda: len(delegate.notifications) == 1)
        async with trio.open_nursery() as nursery:
            responses: list[object] = []

            async def observe() -> None:
                responses.append(await started.initial_response())

            nursery.start_soon(observe)
            await session.shutdown()
        await delegate.until(lambda: delegate.closed == ["1"])
    assert delegate.cancelled_notifications == ["held"]
    assert responses == [Terminated(cell_id="1", content_items=[InputText(text="done")])]


async def test_repeated_termination_is_rejected_while_callback_cleanup_is_pending(
    session: Session, delegate: RecordingDelegate
) -> None:
    delegate.hold_tools = True
    delegate.slow_cleanup = trio.Event()
    with trio.fail_after(10):
        await execute(
            session, delegate, "await tools.slow({})", tools=[tool("slow")], observe_initial=False
        )
        await delegate.until(lambda: len(delegate.invocations) == 1)
        async with trio.open_nursery() as nursery:
            first: list[object] = []

            async def terminate() -> None:
                first.append(await session.terminate("1"))

            nursery.start_soon(terminate)
            await delegate.until(lambda: delegate.cancelled_tools == ["tool-1"])
            with pytest.raises(
                AlreadyTerminatingError, match=r"^exec cell 1 is already terminating$"
            ):
                await session.terminate("1")
            assert first == []
            delegate.slow_cleanup.set()
    assert first == [LiveCell(response=Terminated(cell_id="1", content_items=[]))]
    assert delegate.closed == ["1"]


@pytest.mark.slow
async def test_terminate_waits_for_delegate_cleanup_at_most_the_grace(
    session: Session, delegate: RecordingDelegate
) -> None:
    # The reference's remote driver returned from terminate before the delegate's cleanup
    # (`terminate_returns_before_delegate_cleanup_but_cell_closed_waits`); codemode's providers
    # both return after it, or after the 1 s grace: a delegate that holds its cleanup cannot
    # hold the caller longer than that (design.md, design 4).
    delegate.hold_tools = True
    delegate.slow_cleanup = trio.Event()
    with trio.fail_after(10):
        await execute(
            session, delegate, "await tools.slow({})", tools=[tool("slow")], observe_initial=False
        )
        await delegate.until(lambda: len(delegate.invocations) == 1)
        outcome = await session.terminate("1")
        assert outcome == LiveCell(response=Terminated(cell_id="1", content_items=[]))
        assert delegate.cancelled_tools == ["tool-1"]
        assert delegate.closed == ["1"]  # after the grace, although the cleanup still runs
        delegate.slow_cleanup.set()


async def test_second_observer_is_rejected_without_displacing_the_first(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        started = await execute(session, delegate, "await new Promise(() => {})")
        results: list[object] = []
        async with trio.open_nursery() as nursery:

            async def observe_first() -> None:
                results.append(await started.initial_response())

            nursery.start_soon(observe_first)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(
                ObserverBusyError, match=r"^exec cell 1 already has an active observer$"
            ):
                await session.wait(WaitRequest(cell_id="1", yield_time_ms=LONG_MS))
            terminated = await session.terminate("1")
    assert terminated == LiveCell(response=Terminated(cell_id="1", content_items=[]))
    assert results == [Terminated(cell_id="1", content_items=[])]


async def test_natural_completion_cleans_up_callbacks_before_responding(
    session: Session, delegate: RecordingDelegate
) -> None:
    delegate.hold_tools = True
    with trio.fail_after(10):
        response = await run(
            session, delegate, 'tools.slow({}); text("done")', tools=[tool("slow")]
        )
        assert delegate.cancelled_tools == ["tool-1"]
        await delegate.until(lambda: delegate.closed == ["1"])
    assert response == Completed(cell_id="1", content_items=[InputText(text="done")])


# ---- 9.3 ---------------------------------------------------------------------------------


async def test_termination_rejects_a_waiting_store_commit_before_the_next_cell_can_load_it(
    session: Session, delegate: RecordingDelegate
) -> None:
    delegate.hold_notifications = True
    with trio.fail_after(10):
        # The cell has finished its JS and waits for its notification before committing.
        await execute(
            session, delegate, 'store("candidate", 1); notify("hold")', observe_initial=False
        )
        await delegate.until(lambda: len(delegate.notifications) == 1)
        await session.terminate("1")
        response = await run(session, delegate, 'text(load("candidate"))')
    assert texts(response) == ["undefined"]


async def test_shutdown_rejects_cell_admission_queued_before_the_registry_lock(
    session: Session, delegate: RecordingDelegate
) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            errors: list[BaseException] = []

            async def admit() -> None:
                try:
                    await execute(session, delegate, "1")
                except CodeModeError as error:
                    errors.append(error)

            nursery.start_soon(admit)
            await session.shutdown()
    assert [str(e) for e in errors] == ["code mode session is shutting down"]
    assert session.is_alive is False


async def test_provider_exit_terminates_cpu_bound_cells(provider: Provider) -> None:
    """drop_terminates_cells_when_the_registry_is_locked: leaving the provider ends
    CPU-bound cells (the fixture's exit is bounded here by trio.fail_after)."""
    delegate = RecordingDelegate()
    session = await provider.create_session()
    with trio.fail_after(10):
        await run(session, delegate, "while (true) {}", yield_time_ms=1)
    with trio.fail_after(1):
        await session.shutdown()
    assert delegate.closed == ["1"]
