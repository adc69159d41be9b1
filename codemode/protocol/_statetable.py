"""Lifecycle rules as a table, applied in one place (design.md, style 4; h11 `_state.py`).

A `StateTable` maps `(state, trigger)` to the next state. Its owner calls `move(state,
trigger)` for every change and never assigns a state by hand, so an illegal move is caught where
it happens, with an error naming the table, the state and the trigger. The tables themselves are
the documentation: `docs/architecture.md` prints them (`rows()`), and a test keeps the two equal.

Pure standard library. Its error, `IllegalMoveError`, is defined with the protocol's errors
(`_errors.py`: the compiled build compiles this module, and a compiled module cannot define a
subclass of a built-in exception). The protocol's client connection keeps its cell views with
it, and the host's runtime its cell phases (it is the one helper of this package the runtime
uses: it carries no wire knowledge).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from ._errors import IllegalMoveError

S = TypeVar("S", bound=enum.Enum)
E = TypeVar("E", bound=enum.Enum)


class StateTable(Generic[S, E]):
    """The legal moves of one state machine.

    Args:
        name: what the states belong to, for error messages ("runtime cell").
        moves: for each state, the triggers it accepts and the state each leads to.
        error: the exception type an illegal move raises (default `IllegalMoveError`).
    """

    def __init__(
        self,
        name: str,
        moves: Mapping[S, Mapping[E, S]],
        *,
        error: type[Exception] = IllegalMoveError,
    ) -> None:
        self.name = name
        self._moves = moves
        self._error = error
        # Looked up by member names (`_name_`, a plain attribute, where `name` is a property):
        # an Enum member's own `__hash__` is a Python function (enum.py), and a move on the
        # path of every cell called it twice.
        self._by_name = {
            state._name_: {trigger._name_: target for trigger, target in row.items()}
            for state, row in moves.items()
        }

    def move(self, state: S, trigger: E) -> S:
        """The state `trigger` leads to from `state`.

        Raises:
            the table's error type: the table has no such move.
        """
        try:
            return self._by_name[state._name_][trigger._name_]
        except KeyError:
            raise self._error(
                f"{self.name}: {trigger.name.lower()} is not allowed in state {state.name.lower()}"
            ) from None

    def allows(self, state: S, trigger: E) -> bool:
        """Whether the table has a move for `trigger` from `state`."""
        return trigger in self._moves.get(state, {})

    def rows(self) -> Iterator[tuple[S, E, S]]:
        """Every move as `(state, trigger, next state)`, in table order."""
        for state, moves in self._moves.items():
            for trigger, target in moves.items():
                yield state, trigger, target

    def markdown(self) -> str:
        """The table as a Markdown table (state | trigger | next state)."""
        lines = ["| state | trigger | next state |", "|---|---|---|"]
        for state, trigger, target in self.rows():
            lines.append(f"| {state.value} | {trigger.value} | {target.value} |")
        return "\n".join(lines)
