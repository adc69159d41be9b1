"""Idempotency keys: what a session remembers of its keyed requests, so that a repeated request
gets the first one's outcome instead of acting again (docs/python-api.md, "Idempotency keys").

A book lives in the session object of the application's process (`InProcessSession`,
`WireSession`), one per session, and works the same on every provider: nothing of it crosses
the wire (a client that restarts loses its sessions, and their keys with them). `CodeMode`
keeps one of its own for the model's tool calls (`model/_code_mode.py`).

Rules:
1. A key names one request: its operation and the arguments that decide what it does, its
   *fingerprint* (an execute's whole `ExecuteRequest`, a wait's cell id and window, a
   terminate's cell id). The same key with another fingerprint is refused with
   `InvalidRequestError` (`errors.idempotency_key_reused`), whatever became of the first.
2. The same key and fingerprint get the first request's outcome: at once if it ended (the same
   value, or a copy of the `CodeModeError` it raised: same class, text and attributes), when
   it ends if it is still in flight. That wait is the retry's own: cancelling it leaves the
   first alone. A request that ended without an outcome (cancelled, or failed with an exception
   that is not a `CodeModeError`, a bug's) leaves nothing behind: its retry acts anew.
3. A book holds at most `MAX_KEYS` keys, the oldest (by first use) dropped first, even one
   still in flight (its waiters still get its outcome); a key is dropped `KEY_SECONDS` after
   its request ended, on trio's clock. The outcomes it keeps hold at most `MAX_KEPT_BYTES` of
   output (`outcome_bytes`: a response is mostly its output, which a cell may make megabytes
   of); past that, the oldest keys whose requests ended are dropped, the newest last (so an
   outcome larger than the bound is returned and not kept). A key dropped is new again.
4. A keyed execute's outcome is the cell; each call gets a `StartedCell` of its own, and they
   share the cell's one initial observation (`SharedInitial`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import TypeVar, cast

import msgspec
import trio

from ._api import (
    Completed,
    ContentItem,
    ExecuteRequest,
    InputText,
    LiveCell,
    MissingCell,
    Pending,
    RuntimeResponse,
    Terminated,
    WaitOutcome,
    WaitRequest,
    Yielded,
)
from ._started import StartedCell
from .errors import (
    CodeModeError,
    InvalidRequestError,
    idempotency_key_reused,
    initial_response_taken,
)

MAX_KEYS = 1024
"""The keys a book holds (rule 3): per session, and per `CodeMode`."""
KEY_SECONDS = 600.0
"""How long a key outlives the end of its request (rule 3), in seconds of trio's clock."""
MAX_KEPT_BYTES = 64 << 20
"""The output a book's outcomes may hold (rule 3), counted by `outcome_bytes`."""

_T = TypeVar("_T")

# Sorted map keys: two equal requests whose schemas were built in another order are one request.
_ENCODER = msgspec.msgpack.Encoder(order="deterministic")


def request_fingerprint(operation: str, request: ExecuteRequest) -> tuple[str, bytes]:
    """An execute's fingerprint: a digest of the whole request, not the request (a book may
    keep a thousand of them, and a source can be megabytes)."""
    return operation, hashlib.blake2b(_ENCODER.encode(request), digest_size=16).digest()


def call_key(*parts: str) -> str:
    """A key made of `parts` (a tool name, a call id, its arguments), of a fixed length. Parts
    are length-prefixed, so no two lists of parts make one key; lone surrogates are hashed as
    they are."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def content_bytes(items: list[ContentItem]) -> int:
    """What output items hold: the characters of the texts and of the images' URLs (a
    character takes a byte or more), without encoding them again."""
    return sum(
        len(item.text) if isinstance(item, InputText) else len(item.image_url) for item in items
    )


def outcome_bytes(outcome: object) -> int:
    """What a session's outcome holds of output (rule 3): a response's, a wait's or terminate's
    response's, an error's text. A keyed execute's `SharedInitial` holds nothing when its
    request ends; its response is counted once taken (`IdempotencyBook.execute`)."""
    if isinstance(outcome, LiveCell | MissingCell):
        outcome = outcome.response
    if isinstance(outcome, Yielded | Completed | Terminated | Pending):
        return content_bytes(outcome.content_items)
    if isinstance(outcome, BaseException):
        return len(str(outcome))
    return 0


def _again(error: CodeModeError) -> CodeModeError:
    """A fresh copy of `error` (rule 2): raising one object from every retry would grow its
    traceback with each, and keep the first one's frames alive. Its `__init__` is not run
    again: several classes take other arguments than their text."""
    copy = BaseException.__new__(type(error), *error.args)
    copy.__dict__.update(error.__dict__)
    return copy


class _Entry:
    """One key's request: its fingerprint, and its outcome once it ended."""

    __slots__ = ("ended", "error", "expires", "fingerprint", "kept", "key", "over", "value")

    def __init__(self, key: str, fingerprint: Hashable) -> None:
        self.key = key
        self.fingerprint = fingerprint
        self.over = trio.Event()
        """Set when the request ended, with an outcome (`ended`) or without one."""
        self.ended = False
        self.value: object = None
        self.error: CodeModeError | None = None
        self.expires = float("inf")
        self.kept = 0
        """The output its outcome holds, as the book counted it (rule 3)."""

    def outcome(self) -> object:
        if self.error is not None:
            raise _again(self.error)
        return self.value


class IdempotencyBook:
    """A session's keys and the outcomes of their requests (rules 1-3).

    Args:
        max_keys, key_seconds, max_bytes: the bounds of rule 3 (`max_bytes` None:
            `MAX_KEPT_BYTES` as it is when the book is made).
        measure: what an outcome holds, for `max_bytes` (`outcome_bytes` by default).
    """

    def __init__(
        self,
        *,
        max_keys: int = MAX_KEYS,
        key_seconds: float = KEY_SECONDS,
        max_bytes: int | None = None,
        measure: Callable[[object], int] = outcome_bytes,
    ) -> None:
        self._entries: dict[str, _Entry] = {}  # oldest first (rule 3)
        self._max_keys = max_keys
        self._key_seconds = key_seconds
        self._max_bytes = MAX_KEPT_BYTES if max_bytes is None else max_bytes
        self._measure = measure
        self._kept = 0  # the sum of the held entries' `kept`

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def kept_bytes(self) -> int:
        """The output the outcomes held now keep (rule 3)."""
        return self._kept

    async def run(
        self, key: str | None, fingerprint: Hashable, act: Callable[[], Awaitable[_T]]
    ) -> _T:
        """`act()`, once for `key` (None: no key, it simply runs)."""
        if key is None:
            return await act()
        while True:
            entry = self._find(key)
            if entry is None:
                return await self._act(key, fingerprint, act)
            if entry.fingerprint != fingerprint:
                await trio.lowlevel.checkpoint()
                raise InvalidRequestError(idempotency_key_reused(key))
            if entry.over.is_set():
                await trio.lowlevel.checkpoint()
            else:
                await entry.over.wait()
            if entry.ended:
                return cast(_T, entry.outcome())
            # The first ended without an outcome and is forgotten: this one acts anew, or waits
            # for the retry that got there first.

    def _find(self, key: str) -> _Entry | None:
        now = trio.current_time()
        entries = self._entries
        if entries:
            # One expired key leaves per call, the oldest: a call adds at most one, so they
            # do not pile up (one in flight at the front stops the sweep; the count bounds
            # what waits behind it).
            oldest = next(iter(entries))
            if entries[oldest].expires <= now:
                self._drop(oldest)
        entry = entries.get(key)
        if entry is not None and entry.expires <= now:
            self._drop(key)
            return None
        return entry

    def _drop(self, key: str) -> None:
        self._kept -= self._entries.pop(key).kept

    async def _act(self, key: str, fingerprint: Hashable, act: Callable[[], Awaitable[_T]]) -> _T:
        entry = _Entry(key, fingerprint)
        while len(self._entries) >= self._max_keys:
            self._drop(next(iter(self._entries)))
        self._entries[key] = entry
        try:
            value = await act()
        except CodeModeError as error:
            entry.error = _again(error)  # without the traceback and its frames
            self._ended(entry)
            raise
        except BaseException:
            if self._entries.get(key) is entry:
                self._drop(key)
            entry.over.set()
            raise
        entry.value = value
        self._ended(entry)
        return value

    def _ended(self, entry: _Entry) -> None:
        entry.ended = True
        entry.expires = trio.current_time() + self._key_seconds
        entry.over.set()
        self._keep(entry, self._measure(entry.error if entry.error is not None else entry.value))

    def _keep(self, entry: _Entry, size: int) -> None:
        """Count what `entry`'s outcome holds (if the book still holds it), then drop the
        oldest ended entries while the outcomes hold more than the bound (rule 3)."""
        if self._entries.get(entry.key) is not entry:
            return  # dropped while in flight: its waiters have its outcome, the book not
        entry.kept += size
        self._kept += size
        if self._kept <= self._max_bytes:
            return
        for key in [key for key, held in self._entries.items() if held.ended]:
            self._drop(key)
            if self._kept <= self._max_bytes:
                return

    async def execute(
        self,
        key: str,
        request: ExecuteRequest,
        start: Callable[[], Awaitable[StartedCell]],
        wait: Callable[[WaitRequest], Awaitable[WaitOutcome]],
        *,
        observe_initial: bool,
    ) -> StartedCell:
        """A keyed `Session.execute` (rule 4): `start()` admits the cell and returns the
        session's own `StartedCell`, observed; `wait` is the session's, for `SharedInitial`."""

        async def act() -> SharedInitial:
            started = await start()
            window = request.yield_time_ms
            if window is None:
                window = WaitRequest(cell_id=started.cell_id).yield_time_ms
            shared = SharedInitial(
                started, WaitRequest(cell_id=started.cell_id, yield_time_ms=window), wait
            )
            # The response is taken after the key's request ended: counted then (rule 3).
            shared.on_taken = partial(self._taken_later, key, shared)
            return shared

        shared = await self.run(key, request_fingerprint("execute", request), act)
        return shared.started(observe_initial)

    def _taken_later(self, key: str, shared: SharedInitial, response: RuntimeResponse) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry.value is shared:
            self._keep(entry, self._measure(response))


class SharedInitial:
    """The initial observation of a cell started with an idempotency key, shared by every
    `StartedCell` its key returned (rule 4).

    - The first `initial_response()` among them takes the observation; every other one gets the
      same response: at once once it was delivered, or when it comes (cancelling that await
      leaves the one taking it alone).
    - The first of them given up unawaited (`release()`, `async with`, dropped, or made with
      `observe_initial=False`) releases it, as for a lone `StartedCell`: `wait`s may observe
      the cell. Once it was given up without a response (released, or its await cancelled or
      failed), the next `initial_response()` observes the cell as a `wait` with the request's
      window would, and that response is the one they share (a cell gone by then answers as
      `MissingCell` does: `exec cell N not found`).
    - Each `StartedCell` still answers `initial_response()` once; dropping one unsettled warns
      (`_started`).
    """

    __slots__ = ("_given_up", "_request", "_response", "_started", "_taking", "_wait", "on_taken")

    def __init__(
        self,
        started: StartedCell,
        request: WaitRequest,
        wait: Callable[[WaitRequest], Awaitable[WaitOutcome]],
    ) -> None:
        self._started = started  # the session's own, never handed out
        self._request = request
        self._wait = wait
        self._given_up = False  # `_started` was awaited or released
        self._response: RuntimeResponse | None = None
        self._taking: trio.Event | None = None
        self.on_taken: Callable[[RuntimeResponse], None] | None = None
        """Told the response once it was taken (the book counts what it holds)."""

    def started(self, observe_initial: bool) -> StartedCell:
        """A `StartedCell` of the cell for one call of the key."""
        share = _Share(self, self._started.cell_id)
        return StartedCell._create(
            self._started.cell_id,
            share.initial_response,
            share.release,
            self._started._dropped,  # run before the session's next observation, as its own
            session_id=self._started._session_id,
            observe_initial=observe_initial,
        )

    async def response(self) -> RuntimeResponse:
        while True:
            if self._response is not None:
                await trio.lowlevel.checkpoint()
                return self._response
            if self._taking is not None:
                await self._taking.wait()
                continue
            taking = self._taking = trio.Event()
            try:
                if self._given_up:
                    outcome = await self._wait(self._request)
                    response = outcome.response
                    assert not isinstance(response, Pending), "a plain wait never pauses"
                else:
                    self._given_up = True
                    response = await self._started.initial_response()
                self._response = response
                if self.on_taken is not None:
                    self.on_taken(response)
                return response
            finally:
                self._taking = None
                taking.set()

    def give_up(self) -> None:
        if not self._given_up:
            self._given_up = True
            self._started.release()


class _Share:
    """One `StartedCell`'s part of a `SharedInitial`: its one `initial_response()`."""

    __slots__ = ("_cell_id", "_shared", "_used")

    def __init__(self, shared: SharedInitial, cell_id: str) -> None:
        self._shared = shared
        self._cell_id = cell_id
        self._used = False

    async def initial_response(self) -> RuntimeResponse:
        if self._used:
            await trio.lowlevel.checkpoint()
            raise CodeModeError(initial_response_taken(self._cell_id))
        self._used = True
        return await self._shared.response()

    def release(self) -> None:
        if not self._used:
            self._used = True
            self._shared.give_up()
