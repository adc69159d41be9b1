"""The QuickJS engine: cells that run JavaScript on native worker threads.

`open_engine()` gives an `Engine`; `Engine.start_cell()` gives an `EngineCell`, whose events
(`CellEvent`) report what the cell's JavaScript does. The binding is `codemode_host._quickjs`
(source `_quickjs.c` here) and the cell globals are written in `prelude.js`.
"""

from ._cell import EngineCell as EngineCell
from ._engine import DEFAULT_MAX_WORKERS as DEFAULT_MAX_WORKERS
from ._engine import DEFAULT_STACK_LIMIT as DEFAULT_STACK_LIMIT
from ._engine import IDLE_RELEASE_SECONDS as IDLE_RELEASE_SECONDS
from ._engine import MAX_STACK_LIMIT as MAX_STACK_LIMIT
from ._engine import MAX_WORKERS as MAX_WORKERS
from ._engine import RELEASE_AFTER_CELLS as RELEASE_AFTER_CELLS
from ._engine import CellTool as CellTool
from ._engine import Engine as Engine
from ._engine import EngineClosedError as EngineClosedError
from ._engine import default_heap_budget as default_heap_budget
from ._engine import default_workers as default_workers
from ._engine import open_engine as open_engine
from ._events import CellEvent as CellEvent
from ._events import Finished as Finished
from ._events import Idle as Idle
from ._events import ImageOutput as ImageOutput
from ._events import Notification as Notification
from ._events import Outcome as Outcome
from ._events import Started as Started
from ._events import StoredValueWritten as StoredValueWritten
from ._events import TextOutput as TextOutput
from ._events import TimerCleared as TimerCleared
from ._events import TimerStarted as TimerStarted
from ._events import ToolCallRequested as ToolCallRequested
from ._events import YieldRequested as YieldRequested

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "DEFAULT_STACK_LIMIT",
    "IDLE_RELEASE_SECONDS",
    "MAX_STACK_LIMIT",
    "MAX_WORKERS",
    "RELEASE_AFTER_CELLS",
    "CellEvent",
    "CellTool",
    "Engine",
    "EngineCell",
    "EngineClosedError",
    "Finished",
    "Idle",
    "ImageOutput",
    "Notification",
    "Outcome",
    "Started",
    "StoredValueWritten",
    "TextOutput",
    "TimerCleared",
    "TimerStarted",
    "ToolCallRequested",
    "YieldRequested",
    "default_heap_budget",
    "default_workers",
    "open_engine",
]
