"""The protocol's own errors, split by whose fault they are (h11 `_util.py`).

    ProtocolError              the byte stream or the message sequence broke the rules
    ├── LocalProtocolError     we were about to break them (a bug on this side): nothing was sent
    └── RemoteProtocolError    the peer broke them: the connection cannot continue
        ├── FrameTooLargeError a declared frame length over MAX_FRAME_BYTES
        └── FrameDecodeError   a frame whose payload is not a valid message

    IllegalMoveError           a state table's owner made a move the table does not allow

`FrameTooLargeError` is also what the encoder raises for an oversized message of our own (it
is then a local refusal, caught and reported per operation by the connections).
"""

from __future__ import annotations


class ProtocolError(Exception):
    """The byte stream or the message sequence broke the protocol's rules."""


class LocalProtocolError(ProtocolError):
    """This side asked for something the protocol does not allow; nothing was sent."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol; the connection is unusable from now on."""


class IllegalMoveError(RuntimeError):
    """A move a `StateTable` does not allow: a bug in the table's owner, never a user error."""
