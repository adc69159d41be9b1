"""The code-mode runtime: sessions, cells, observers and delegate calls, in trio.

It knows the engine's turn-and-event interface and codemode's public types, and nothing of the
wire: the in-process provider serves it directly, the host's server puts it behind frames.
"""

from codemode._trio import CLEANUP_GRACE as CLEANUP_GRACE

from ._admission import Admission as Admission
from ._admission import worker_ceiling as worker_ceiling
from ._cell import RuntimeCell as RuntimeCell
from ._observer import ObservationCancelledError as ObservationCancelledError
from ._observer import Preemption as Preemption
from ._observer import observation_window_ms as observation_window_ms
from ._phases import ACTIVE as ACTIVE
from ._phases import INITIAL as INITIAL
from ._phases import LIFECYCLE as LIFECYCLE
from ._phases import OBSERVATION as OBSERVATION
from ._session import RuntimeSession as RuntimeSession
from ._watch import CellWatch as CellWatch

__all__ = [
    "ACTIVE",
    "CLEANUP_GRACE",
    "INITIAL",
    "LIFECYCLE",
    "OBSERVATION",
    "Admission",
    "CellWatch",
    "ObservationCancelledError",
    "Preemption",
    "RuntimeCell",
    "RuntimeSession",
    "observation_window_ms",
    "worker_ceiling",
]
