"""Types of the C extension `codemode_host._quickjs` (source: host/engine/_quickjs.c)."""

from typing import Final, final

QUICKJS_VERSION: Final[str]
MAX_STACK_LIMIT: Final[int]
DEFAULT_STACK_LIMIT: Final[int]

EV_STARTED: Final[int]
EV_TEXT: Final[int]
EV_IMAGE: Final[int]
EV_NOTIFY: Final[int]
EV_TOOL_CALL: Final[int]
EV_STORE: Final[int]
EV_YIELD: Final[int]
EV_TIMER_SET: Final[int]
EV_TIMER_CLEAR: Final[int]
EV_FINISHED: Final[int]
EV_IDLE: Final[int]

OUTCOME_OK: Final[int]
OUTCOME_ERROR: Final[int]
OUTCOME_INTERRUPTED: Final[int]
OUTCOME_CPU_LIMIT: Final[int]
FINISHED_CPU_SHIFT: Final[int]

class EngineClosedError(RuntimeError): ...

@final
class Cell:
    @property
    def key(self) -> int | None: ...
    def settle_tool(self, call_id: int, settle: int, payload: bytes, /) -> None: ...
    def fire_timer(self, timer_id: int, /) -> None: ...
    def output_taken(self, bytes: int, /) -> None: ...
    def interrupt(self) -> None: ...
    def close(self) -> None: ...

@final
class Engine:
    def __init__(
        self,
        workers: int,
        prelude: bytes,
        images: bytes,
        max_workers: int,
        fault_events_after: int = -1,
        heap_budget: int = 0,
        prepared_cells: int = 0,
    ) -> None: ...
    @property
    def live_cells(self) -> int: ...
    @property
    def prepared_cells(self) -> int: ...
    def wait_prepared(self, seconds: float, /) -> bool: ...
    @property
    def prepared_taken(self) -> int: ...
    @property
    def trims(self) -> int: ...
    def wait_trimmed(self, after: int, seconds: float, /) -> int: ...
    def trim(self) -> None: ...
    @property
    def heap_total(self) -> int: ...
    @property
    def worker_threads(self) -> int: ...
    def start_cell(
        self,
        key: int,
        source: bytes,
        config: bytes,
        heap_limit: int,
        stack_limit: int,
        cpu_limit_ms: int = 0,
        output_limit: int = 0,
    ) -> Cell: ...
    # Each tuple is a `codemode_host.engine._events.RawEvent`: (key, kind, n1, n2, a, b).
    def drain(self) -> list[tuple[int, int, int, int, str | bytes | None, str | bytes | None]]: ...
    def fileno(self) -> int: ...
    def close(self) -> None: ...
