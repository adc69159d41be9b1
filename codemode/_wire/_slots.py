"""The callers awaiting a host link's answers: one-shot slots by request id (`HostLink`).

An operation queues its request, then awaits its slot; the link's reader hands each answer to
its slot as the connection's event is dispatched (`deliver_answer`, `deliver_initial`).

Rules:
1. A caller cancelled before its answer retires the request (`ClientConnection.cancel`); its
   answer, when it comes, is refused by the slot and taken back by the connection
   (`undelivered`) before the next frame is read: nothing is lost.
2. When the link is lost every slot gets the loss (`fail_all`). Its caller raises it, or, when
   a cut connection could not be resumed, `RuntimeReplacedError` (its kept-values text for a
   session that keeps them): the session is then noted as told (`announced`), so its next
   generation does not say it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._trio import OneShot
from ..errors import RUNTIME_REPLACED_KEPT, CodeModeError, HostLostError, RuntimeReplacedError
from ..protocol import ClientConnection, Err, HostResponse, Ok

HostResult = Ok[HostResponse] | Err
InitialResult = Ok[Any] | Err
_Slots = dict[int, tuple[OneShot[Any], str]]


class AnswerSlots:
    """The slots of one link's requests and initial responses.

    Args:
        connection: the link's connection (retirement, answers taken back).
        pump: dispatches what the connection has (a retirement may answer at once).
        keeps_values: whether a session keeps its stored values (rule 2's text).
    """

    def __init__(
        self,
        connection: ClientConnection,
        pump: Callable[[], None],
        keeps_values: Callable[[str], bool],
    ) -> None:
        self._connection = connection
        self._pump = pump
        self._keeps_values = keeps_values
        self._answers: _Slots = {}
        self._initials: _Slots = {}
        self._failed = False
        self.not_resumed = False
        """The loss was a cut connection that could not be resumed (rule 2)."""
        self._announced: set[str] = set()

    def announced(self, session_id: str) -> bool:
        return session_id in self._announced

    async def answer(self, request_id: int, session_id: str) -> HostResult:
        """Await the `operation/response` of `request_id`."""
        result: HostResult = await self._await(self._answers, request_id, session_id)
        return result

    async def initial(self, request_id: int, session_id: str) -> InitialResult:
        """Await the initial response of execute `request_id`."""
        result: InitialResult = await self._await(self._initials, request_id, session_id)
        return result

    def deliver_answer(self, request_id: int, result: HostResult) -> None:
        self._deliver(self._answers.pop(request_id, None), request_id, result)

    def deliver_initial(self, request_id: int, result: InitialResult) -> None:
        self._deliver(self._initials.pop(request_id, None), request_id, result)

    def fail_all(self, failure: HostLostError) -> None:
        """Rule 2: the link is lost."""
        self._failed = True
        for slots in (self._answers, self._initials):
            for slot, _ in slots.values():
                slot.set(failure)

    def failure_of(self, session_id: str, failure: HostLostError) -> CodeModeError:
        """What an operation of the session in flight at the loss raises (rule 2)."""
        if not self.not_resumed:
            return failure
        self._announced.add(session_id)
        text = RUNTIME_REPLACED_KEPT if self._keeps_values(session_id) else None
        replaced = RuntimeReplacedError() if text is None else RuntimeReplacedError(text)
        replaced.__cause__ = failure
        return replaced

    async def _await(self, slots: _Slots, request_id: int, session_id: str) -> Any:
        """Await the answer of `request_id`; a cancelled caller retires the request (rule 1)."""
        slot: OneShot[Any] = OneShot()
        slots[request_id] = (slot, session_id)
        self._pump()
        try:
            answer = await slot.get()
        except BaseException:
            slots.pop(request_id, None)
            if not self._failed and self._connection.is_open and not slot.is_set():
                self._connection.cancel(request_id)
                self._pump()
            raise
        if isinstance(answer, HostLostError):
            raise self.failure_of(session_id, answer)
        return answer

    def _deliver(
        self,
        waiter: tuple[OneShot[Any], str] | None,
        request_id: int,
        result: HostResult | InitialResult,
    ) -> None:
        """Hand an answer to its caller; one whose caller was cancelled meanwhile goes back to
        the connection at once (rule 1)."""
        if waiter is None:
            return
        slot, session_id = waiter
        if not slot.set(result):
            self._connection.undelivered(request_id, session_id, result)
