"""A value delivered once and awaited: the answer to something sent across the wire.

Shared by the host (answers to its reverse calls) and the client (operation responses and
initial responses).
"""

from __future__ import annotations

from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class OneShot(Generic[T]):
    """Holds the first value `set` delivers; tasks wait for it."""

    __slots__ = ("_event", "_value")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._value: T | None = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self, value: T) -> None:
        """Deliver `value`; a later delivery is ignored (the first answer wins)."""
        if not self._event.is_set():
            self._value = value
            self._event.set()

    async def wait(self) -> None:
        """Wait until a value was delivered."""
        await self._event.wait()

    def value(self) -> T:
        """The delivered value (call only once `is_set()`)."""
        assert self._event.is_set(), "no value was delivered yet"
        return self._value  # type: ignore[return-value]

    async def get(self) -> T:
        """Wait for the value and return it."""
        await self._event.wait()
        return self.value()
