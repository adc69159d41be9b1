"""The client's end of the wire, shared by the providers whose cells run in a host.

A host link (`HostLink`, the trio adapter around the sans-IO `ClientConnection`) over a
`HostTransport`, the reverse calls of its cells, and the session bound to a link.
"""

from ._delegates import LINK_WORKERS as LINK_WORKERS
from ._link import CLOSE_TIMEOUT as CLOSE_TIMEOUT
from ._link import HANDSHAKE_TIMEOUT as HANDSHAKE_TIMEOUT
from ._link import HostLink as HostLink
from ._session import ProcessSession as ProcessSession
from ._transport import CONNECT_TIMEOUT as CONNECT_TIMEOUT
from ._transport import DRAIN_TIMEOUT as DRAIN_TIMEOUT
from ._transport import PARENT_VARIABLE as PARENT_VARIABLE
from ._transport import HostTransport as HostTransport
