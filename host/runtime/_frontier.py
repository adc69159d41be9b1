"""The pending frontier of one cell (design.md, runtime 5.9): when it pauses, what it holds back.

A cell is *quiescent* when the engine has run every command it was given (its start, each tool
answer, each timer firing) and its JavaScript has nothing left to do until the next one; the
engine reports that with an `Idle` event whose count equals what was submitted.

Rules:
1. In *frontier mode* (entered when a frontier observer attaches, left when a plain observer
   does) a quiescent cell *pauses*: tool answers and timer firings are held here, in order, and
   reach the engine only when the cell resumes.
2. The frontier is *delivered* when a frontier observer takes it: its output, and the ids of the
   tool calls the cell issued since the previous delivered frontier. A frontier observer that
   arrives while the cell is paused at an undelivered frontier gets it at once, without resuming
   the cell (a cancelled observer loses nothing); at a delivered one, it resumes the cell and
   waits for the next frontier.
3. Out of frontier mode every quiescence starts a new frontier: the ids issued before it are no
   longer "since the previous frontier".
4. A held command re-checks, when it finally runs, that the cell still takes it; a terminated
   cell drops what is held.
"""

from __future__ import annotations

from collections.abc import Callable

from codemode_host.engine import EngineCell, Idle

Command = Callable[[], None]


class Frontier:
    """The frontier state of one cell.

    Attributes:
        mode: whether a quiescence pauses the cell (rule 1).
        paused: whether commands are held.
        delivered: whether a frontier observer took the current pause's frontier.
    """

    __slots__ = ("_engine_cell", "_held", "_tool_call_ids", "delivered", "mode", "paused")

    def __init__(self, engine_cell: EngineCell, *, mode: bool) -> None:
        self._engine_cell = engine_cell
        self.mode = mode
        self.paused = False
        self.delivered = False
        self._held: list[Command] = []
        self._tool_call_ids: list[str] = []

    @property
    def held(self) -> int:
        """How many commands wait for the cell to resume."""
        return len(self._held)

    @property
    def undelivered(self) -> bool:
        """Whether the cell sits at a frontier no observer took yet."""
        return self.paused and not self.delivered

    def submit(self, command: Command) -> None:
        """Run a command for the engine now, or hold it while the cell is paused."""
        if self.paused:
            self._held.append(command)
        else:
            command()

    def issued(self, tool_call_id: str) -> None:
        self._tool_call_ids.append(tool_call_id)

    def reached(self, event: Idle) -> bool:
        """Whether the turn `event` ends left the cell paused at a new frontier."""
        if event.commands_taken != self._engine_cell.commands_submitted:
            return False  # more work was submitted meanwhile: not quiescent
        if not self.mode:
            self._tool_call_ids.clear()  # rule 3
            return False
        self.paused = True
        self.delivered = False
        return True

    def deliver(self) -> list[str]:
        """Hand the frontier to its observer: the tool call ids it reports."""
        self.delivered = True
        ids, self._tool_call_ids = self._tool_call_ids, []
        return ids

    def enter(self) -> None:
        """A frontier observer attached (rule 2): resume a cell whose frontier was taken."""
        self.mode = True
        if self.paused and self.delivered:
            self.resume()

    def leave(self) -> None:
        """A plain observer attached: the cell runs freely again."""
        self.mode = False
        if self.paused:
            self.resume()

    def resume(self) -> None:
        self.paused = False
        held, self._held = self._held, []
        for command in held:
            command()

    def drop(self) -> None:
        """The cell ends: what is held never runs (rule 4)."""
        self._held.clear()
        self.paused = False
