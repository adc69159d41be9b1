"""The wire protocol between codemode and its host, sans-IO (design.md: style 3, design 1
and 3).

Frame types, the framing codec, and the two connection state machines: `ClientConnection`
(the process provider's side) and `HostConnection` (the host program's side). Both take bytes
and give events, take calls and give bytes, and own the protocol's rules (handshake, ids,
ordering, retirement, frame limits). Imports msgspec, the standard library and codemode's own
value types only: no trio, no I/O. Each side wraps its connection in a thin trio adapter.
"""

from typing import TYPE_CHECKING

from ..errors import ErrorKind as ErrorKind
from ._capabilities import APPROVAL_CAPABILITY as APPROVAL_CAPABILITY
from ._capabilities import BUDGET_CAPABILITY as BUDGET_CAPABILITY
from ._capabilities import CAPABILITIES as CAPABILITIES
from ._capabilities import CLOSING_INITIAL_CAPABILITY as CLOSING_INITIAL_CAPABILITY
from ._capabilities import DENIAL_CAPABILITY as DENIAL_CAPABILITY
from ._capabilities import HEARTBEAT_CAPABILITY as HEARTBEAT_CAPABILITY
from ._capabilities import INVENTORY_CAPABILITY as INVENTORY_CAPABILITY
from ._capabilities import KEPT_VALUES_CAPABILITY as KEPT_VALUES_CAPABILITY
from ._capabilities import LIMITS_CAPABILITY as LIMITS_CAPABILITY
from ._capabilities import PENDING_FRONTIER_CAPABILITY as PENDING_FRONTIER_CAPABILITY
from ._capabilities import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._capabilities import RESUME_CAPABILITY as RESUME_CAPABILITY
from ._capabilities import TRACE_CAPABILITY as TRACE_CAPABILITY
from ._capabilities import WALL_TIME_CAPABILITY as WALL_TIME_CAPABILITY
from ._capabilities import YIELD_CAPABILITY as YIELD_CAPABILITY
from ._codec import MAX_FRAME_BYTES as MAX_FRAME_BYTES
from ._codec import NEED_DATA as NEED_DATA
from ._codec import FrameDecodeError as FrameDecodeError
from ._codec import FrameDecoder as FrameDecoder
from ._codec import FrameEncoder as FrameEncoder
from ._codec import FrameLengthError as FrameLengthError
from ._codec import FrameTooLargeError as FrameTooLargeError
from ._codec import NeedData as NeedData
from ._connection_messages import Ack as Ack
from ._connection_messages import Goodbye as Goodbye
from ._connection_messages import Hello as Hello
from ._connection_messages import InvalidHello as InvalidHello
from ._connection_messages import MissingRequiredCapability as MissingRequiredCapability
from ._connection_messages import NoCompatibleVersion as NoCompatibleVersion
from ._connection_messages import Ping as Ping
from ._connection_messages import Pong as Pong
from ._connection_messages import Ready as Ready
from ._connection_messages import Rejected as Rejected
from ._connection_messages import RejectReason as RejectReason
from ._connection_messages import Resume as Resume
from ._connection_messages import Resumed as Resumed
from ._connection_messages import ResumeRefused as ResumeRefused
from ._connection_messages import Unauthorized as Unauthorized
from ._connection_messages import VersionMismatch as VersionMismatch
from ._connection_messages import describe_rejection as describe_rejection
from ._errors import IllegalMoveError as IllegalMoveError
from ._errors import LocalProtocolError as LocalProtocolError
from ._errors import ProtocolError as ProtocolError
from ._errors import RemoteProtocolError as RemoteProtocolError
from ._events import Answered as Answered
from ._events import ApprovalWaiting as ApprovalWaiting
from ._events import CancelRequested as CancelRequested
from ._events import CellEnded as CellEnded
from ._events import ClientEvent as ClientEvent
from ._events import ClientStatistics as ClientStatistics
from ._events import ConnectionEnded as ConnectionEnded
from ._events import ConnectionResumed as ConnectionResumed
from ._events import DelegateAnswered as DelegateAnswered
from ._events import DelegateCancelled as DelegateCancelled
from ._events import DelegateRequested as DelegateRequested
from ._events import GoodbyeReceived as GoodbyeReceived
from ._events import HandshakeCompleted as HandshakeCompleted
from ._events import HandshakeRejected as HandshakeRejected
from ._events import HostEvent as HostEvent
from ._events import HostStatistics as HostStatistics
from ._events import InitialAnswered as InitialAnswered
from ._events import PreemptRequested as PreemptRequested
from ._events import RequestReceived as RequestReceived
from ._events import ResumeFailed as ResumeFailed
from ._events import ResumeRequested as ResumeRequested
from ._events import StoredValuesCommitted as StoredValuesCommitted
from ._messages import CellClosed as CellClosed
from ._messages import CellList as CellList
from ._messages import ClientMessage as ClientMessage
from ._messages import DelegateCancel as DelegateCancel
from ._messages import DelegateRequest as DelegateRequest
from ._messages import DelegateResponse as DelegateResponse
from ._messages import DelegateWaiting as DelegateWaiting
from ._messages import Err as Err
from ._messages import Execute as Execute
from ._messages import ExecuteToPending as ExecuteToPending
from ._messages import ExecutionStarted as ExecutionStarted
from ._messages import GetUsage as GetUsage
from ._messages import HostMessage as HostMessage
from ._messages import HostRequest as HostRequest
from ._messages import HostResponse as HostResponse
from ._messages import InitialResponse as InitialResponse
from ._messages import ListCells as ListCells
from ._messages import NotificationDelivered as NotificationDelivered
from ._messages import NotificationSend as NotificationSend
from ._messages import Ok as Ok
from ._messages import OpenSession as OpenSession
from ._messages import OperationCancel as OperationCancel
from ._messages import OperationRequest as OperationRequest
from ._messages import OperationResponse as OperationResponse
from ._messages import OperationYield as OperationYield
from ._messages import SessionClosed as SessionClosed
from ._messages import SessionCommitted as SessionCommitted
from ._messages import SessionReady as SessionReady
from ._messages import ShutdownSession as ShutdownSession
from ._messages import Terminate as Terminate
from ._messages import ToolInvoke as ToolInvoke
from ._messages import ToolResult as ToolResult
from ._messages import UsageReport as UsageReport
from ._messages import Wait as Wait
from ._messages import WaitCompleted as WaitCompleted
from ._messages import WaitToPending as WaitToPending
from ._states import ConnectionState as ConnectionState
from ._statetable import StateTable as StateTable

if TYPE_CHECKING:
    from ._client import ClientConnection as ClientConnection
    from ._host import HostConnection as HostConnection


def __getattr__(name: str) -> object:
    # Each side loads only its own connection: the host starts faster without the client's.
    if name == "ClientConnection":
        from . import _client

        return getattr(_client, name)
    if name == "HostConnection":
        from . import _host

        return getattr(_host, name)
    raise AttributeError(f"module 'codemode.protocol' has no attribute {name!r}")
