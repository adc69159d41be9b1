"""A cell as its observers see it: which observer watches it (the OBSERVATION table of
`_phases`), the initial observation `execute` attached, and the response each observation gets
from the cell's lifecycle and output.

`RuntimeCell` (`_cell`) is a `WatchedCell`: this base owns the observation half of a cell (rules
3, 5 and 6 of `_cell`), the cell its lifecycle, its engine events, its termination and its task.
The base only reads the lifecycle; it changes it through the two hooks the cell defines
(`_move`, `_close`), so every change still goes through the one place rule 7 of `_cell` names.
"""

from __future__ import annotations

import trio

from codemode import Completed, Pending, RuntimeResponse, Terminated, Yielded
from codemode.errors import ObserverBusyError, RuntimeEndedError

from ._calls import CellCalls
from ._frontier import Frontier
from ._jswait import JavaScriptWait
from ._observer import InitialObservation, ObservationCancelledError, Observer
from ._output import CellOutput
from ._phases import OBSERVATION, Lifecycle, LifecycleTrigger, Watch, WatchTrigger
from ._share import CellShare


class WatchedCell:
    """The observation half of a `RuntimeCell`: its observers and the responses they get.

    The attributes below are the cell's (`RuntimeCell.__init__` sets them); this half reads
    them and moves only `watch` and `_observer` itself."""

    cell_id: str
    lifecycle: Lifecycle
    watch: Watch
    initial: InitialObservation
    _observer: Observer | None
    _frontier: Frontier
    _calls: CellCalls
    _js_wait: JavaScriptWait
    _output: CellOutput
    _share: CellShare
    _terminated: Terminated | None
    _completion_error: str | None

    def _move(self, trigger: LifecycleTrigger) -> None:
        """The cell's one way to change its lifecycle (rule 7 of `_cell`)."""
        raise NotImplementedError

    def _close(self) -> None:
        """Close the cell (rule 4 of `_cell`)."""
        raise NotImplementedError

    def attach(self, window_ms: int | None) -> Observer:
        """A new observation whose window starts now (None: a frontier observer, which resumes
        a cell paused at a frontier it already delivered); the cell must have no other
        observer. A plain observer resumes a paused cell for good."""
        if self.watch is not Watch.IDLE:
            raise ObserverBusyError(self.cell_id)
        self.watch = OBSERVATION.move(self.watch, WatchTrigger.ATTACH)
        observer = Observer(window_ms, start_now=True)
        self._observer = observer
        if observer.frontier:
            self._frontier.enter()
        else:
            self._frontier.leave()
        return observer

    def preempt(self, observer: Observer | None = None) -> None:
        """The active observation (only if it is `observer`, when given) yields now with the
        output so far; frontier observers and a cell without an observer are unaffected."""
        active = self._observer
        if active is None or (observer is not None and active is not observer):
            return
        if not active.frontier and self.lifecycle is Lifecycle.RUNNING:
            self._mark_boundary(active)

    async def initial_response(self) -> RuntimeResponse | Pending:
        """The observation `execute` attached, awaited once by `StartedCell.initial_response`
        (rule 5)."""
        observer = self.initial.take(self.cell_id)
        try:
            return await self.observe(observer)
        finally:
            self.initial.done()

    def initial_response_now(self) -> RuntimeResponse | Pending | None:
        """The initial observation's response if it has one now, taken without a task (rule 8
        of `_observer`); None: `initial_response()` must be awaited (a frontier observer's is).
        Raises as `initial_response()` does, `ObservationCancelledError` included."""
        return self.initial.take_now(self._answer, self._detach)

    def release_initial_observer(self) -> None:
        """The `StartedCell` gave its initial observation up unawaited: `wait`s may observe."""
        observer = self.initial.release()
        if observer is not None:
            self._detach(observer)

    async def observe(self, observer: Observer) -> RuntimeResponse | Pending:
        """Wait for the observation's end and build its response (rule 1 of `_observer`).

        Raises:
            RuntimeEndedError: the cell closed without answering this observation.
            FrameLimitError: its next output item alone exceeds the response budget (the
                item stays in the cell).
        """
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            while True:
                if observer.frontier and self._frontier.undelivered:
                    await self._calls.all_started()  # rule 4 of `_calls`
                response = self._answer(observer)
                if response is not None:
                    return response
                if self.lifecycle is Lifecycle.RUNNING:
                    self._js_wait.wake_at(observer.deadline, self._wake_observer)
                await observer.sleep()
        finally:
            self._detach(observer)

    def _answer(self, observer: Observer) -> RuntimeResponse | Pending | None:
        if observer.cancelled:
            raise ObservationCancelledError()
        return self._response_for(observer)

    def _detach(self, observer: Observer) -> None:
        if self._observer is observer:
            self._observer = None
            self.watch = OBSERVATION.move(self.watch, WatchTrigger.DETACH)
            self._calls.release_held()

    def _mark_boundary(self, observer: Observer) -> None:
        observer.mark_boundary(len(self._output))
        self.watch = OBSERVATION.move(self.watch, WatchTrigger.BOUNDARY)

    def _response_for(self, observer: Observer) -> RuntimeResponse | Pending | None:
        if self._terminated is not None:
            return self._terminated
        if self.lifecycle is Lifecycle.CLOSED:
            raise RuntimeEndedError()
        if self.lifecycle is Lifecycle.TERMINATING:
            return None
        if observer.boundary is not None:
            return self._output.yielded(observer.boundary)
        if self.lifecycle is Lifecycle.COMPLETED:
            completion = self._take_completion(self._share.max_response_bytes)
            if isinstance(completion, Completed):
                self._close()  # delivered: it closes now (design.md, runtime 5.4, step 6)
            elif observer.frontier:
                # Past the budget: the rest and the completion follow, and a frontier
                # observer never yields.
                return self._output.pending(completion.content_items, [])
            return completion
        if self.lifecycle is Lifecycle.CLAIMED:
            return None  # a terminate took the completion: this observation ends at close
        if observer.frontier:
            if self.lifecycle is Lifecycle.RUNNING and self._frontier.undelivered:
                items = self._output.take(len(self._output))
                return self._output.pending(items, self._frontier.deliver())
            return None
        if observer.expired(self._share.now()):
            return self._output.yielded(len(self._output))
        return None

    def _take_completion(self, budget: int | None) -> Completed | Yielded:
        if not self._output.fits(budget):
            return self._output.yielded(len(self._output))  # the completion follows the rest
        self._move(LifecycleTrigger.CLAIM)
        return self._output.completed(self._completion_error)

    def _wake_observer(self) -> None:
        if self._observer is not None:
            self._observer.notify()
