"""What can be read from a frame that does not decode: its message type and its id.

The host answers a request, or fails a delegate call, whose body is wrong instead of ending the
connection (`HostConnection`, rule 9): that needs the frame's `type` and `id` even though the
rest of it does not fit the schema. Only those two message types are salvaged; anything else (an
unknown type, no id, not a msgpack map at all) stays fatal.
"""

from __future__ import annotations

import msgspec

SALVAGED = ("operation/request", "delegate/response")
"""The message types whose broken body fails one request or one call, not the connection."""


class _Envelope(msgspec.Struct):
    """The two fields every salvageable message has; any other field is ignored here."""

    type: str
    id: int


_decoder = msgspec.msgpack.Decoder(_Envelope)


def salvage(payload: bytes) -> tuple[str, int] | None:
    """`(type, id)` of a salvageable message's payload, or None."""
    try:
        envelope = _decoder.decode(payload)
    except msgspec.DecodeError:
        return None
    if envelope.type not in SALVAGED or not 1 <= envelope.id <= 2**63 - 1:
        return None
    return envelope.type, envelope.id
