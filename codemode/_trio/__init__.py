"""The trio helpers both ends of the wire use (the client's process provider and the host).

Private: the host (`codemode_host`) imports them from here, applications never do.

- `OneShot`: a value delivered once and awaited (the answer to something sent across the wire).
- `CallbackGroup`, `CallWorkers`, `DelegateCall`, `CLEANUP_GRACE`: delegate calls of one cell,
  cancellable, run by parked worker tasks.
- `contained`: which exceptions of a delegate call stay in that call.
- `open_detached_nursery`: a nursery its owner may leave while calls that ignore
  cancellation still run in it.
- `open_service_nursery`: a nursery whose body's own exception leaves it unwrapped.
- `RunOnce`: a job run once as a task, awaited to its end by every caller.
- `FrameWriter`: sends what a sans-IO connection queued, in order, at once when it can.
- `ChunkReader`: receives what the peer sent, one pass of the scheduler per arrival.
- `Alarms`: many deadlines served by one task (the host's engine keeps its cells' there).
"""

from ._alarms import Alarm as Alarm
from ._alarms import Alarms as Alarms
from ._callbacks import CLEANUP_GRACE as CLEANUP_GRACE
from ._callbacks import CallbackGroup as CallbackGroup
from ._callbacks import CallWorkers as CallWorkers
from ._callbacks import DelegateCall as DelegateCall
from ._containment import contained as contained
from ._detached import open_detached_nursery as open_detached_nursery
from ._heartbeat import Heartbeat as Heartbeat
from ._nursery import open_service_nursery as open_service_nursery
from ._once import RunOnce as RunOnce
from ._oneshot import OneShot as OneShot
from ._reader import ChunkReader as ChunkReader
from ._writer import FrameWriter as FrameWriter

__all__ = [
    "CLEANUP_GRACE",
    "Alarm",
    "Alarms",
    "CallWorkers",
    "CallbackGroup",
    "ChunkReader",
    "DelegateCall",
    "FrameWriter",
    "OneShot",
    "RunOnce",
    "contained",
    "open_detached_nursery",
    "open_service_nursery",
]
