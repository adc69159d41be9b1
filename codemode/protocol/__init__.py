"""The wire protocol between codemode and its host, sans-IO: frame types and framing codec.

Imports msgspec and the standard library only (no trio, no I/O): both sides wrap it in their own
trio adapters.
"""

from ._codec import MAX_FRAME_BYTES as MAX_FRAME_BYTES
from ._codec import NEED_DATA as NEED_DATA
from ._codec import FrameDecodeError as FrameDecodeError
from ._codec import FrameDecoder as FrameDecoder
from ._codec import FrameEncoder as FrameEncoder
from ._codec import FrameTooLargeError as FrameTooLargeError
from ._codec import NeedData as NeedData
from ._codec import ProtocolError as ProtocolError
from ._messages import LIMITS_CAPABILITY as LIMITS_CAPABILITY
from ._messages import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._messages import CellClosed as CellClosed
from ._messages import ClientMessage as ClientMessage
from ._messages import DelegateCancel as DelegateCancel
from ._messages import DelegateRequest as DelegateRequest
from ._messages import DelegateResponse as DelegateResponse
from ._messages import Err as Err
from ._messages import Execute as Execute
from ._messages import ExecutionStarted as ExecutionStarted
from ._messages import Hello as Hello
from ._messages import HostMessage as HostMessage
from ._messages import HostRequest as HostRequest
from ._messages import HostResponse as HostResponse
from ._messages import InitialResponse as InitialResponse
from ._messages import InvalidHello as InvalidHello
from ._messages import MissingRequiredCapability as MissingRequiredCapability
from ._messages import NoCompatibleVersion as NoCompatibleVersion
from ._messages import NotificationDelivered as NotificationDelivered
from ._messages import NotificationSend as NotificationSend
from ._messages import Ok as Ok
from ._messages import OpenSession as OpenSession
from ._messages import OperationCancel as OperationCancel
from ._messages import OperationRequest as OperationRequest
from ._messages import OperationResponse as OperationResponse
from ._messages import Ready as Ready
from ._messages import Rejected as Rejected
from ._messages import RejectReason as RejectReason
from ._messages import SessionClosed as SessionClosed
from ._messages import SessionReady as SessionReady
from ._messages import ShutdownSession as ShutdownSession
from ._messages import Terminate as Terminate
from ._messages import ToolInvoke as ToolInvoke
from ._messages import ToolResult as ToolResult
from ._messages import Wait as Wait
from ._messages import WaitCompleted as WaitCompleted
