"""The client's end of the wire: what every provider whose cells run in a host shares.

- `_link.py`: `HostLink`, one host and its connection (the trio adapter around the sans-IO
  `ClientConnection`, `_link_core.py`, on the streams of `_stream.py`, resumed by
  `_resume.py`) and the operations on it, over a `HostTransport` (`_transport.py`) that a
  provider gives it;
- `_delegates.py`: the reverse calls of a link's cells, run in the provider's workers;
- `_session.py`: `WireSession`, the one session class, bound to a link with its generations
  (`_generations.py`); it checks the application's values and hands its cell requests to
  `_session_core.py`;
- `_placement.py`: `Placement`, the strategy that finds a session's host: the only part that
  differs between providers (`codemode.process`'s pool, `codemode.remote`'s listening hosts);
- `_sessions.py`: `WireSessions`, a provider's sessions, their statistics and its close.
"""

from ._delegates import LINK_WORKERS as LINK_WORKERS
from ._link import HostLink as HostLink
from ._link_core import CLOSE_TIMEOUT as CLOSE_TIMEOUT
from ._link_core import HANDSHAKE_TIMEOUT as HANDSHAKE_TIMEOUT
from ._placement import Placement as Placement
from ._session import WireSession as WireSession
from ._sessions import SHUTDOWN_TIMEOUT as SHUTDOWN_TIMEOUT
from ._sessions import WireSessions as WireSessions
from ._sessions import open_wire_sessions as open_wire_sessions
from ._transport import CONNECT_TIMEOUT as CONNECT_TIMEOUT
from ._transport import DRAIN_TIMEOUT as DRAIN_TIMEOUT
from ._transport import PARENT_VARIABLE as PARENT_VARIABLE
from ._transport import HostTransport as HostTransport
from ._transport import NothingListeningError as NothingListeningError
