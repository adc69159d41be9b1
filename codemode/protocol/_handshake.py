"""The client's half of the handshake: the hello it sends and the checks of the host's answer.

Pure functions of the messages (the host's half is `HostConnection._handshake`, which owns the
refusals).
"""

from __future__ import annotations

from collections.abc import Collection

from ._capabilities import PROTOCOL_VERSION
from ._connection_messages import Hello, Ready
from ._errors import RemoteProtocolError
from ._messages import HostMessage


def client_hello(
    required: Collection[str],
    optional: Collection[str],
    codemode_version: str | None,
    token: str | None,
) -> Hello:
    """The hello of a client offering protocol version 1 and these capabilities."""
    return Hello(
        supported_versions=[PROTOCOL_VERSION],
        required_capabilities=list(required),
        optional_capabilities=list(optional),
        codemode_version=codemode_version,
        token=token,
    )


def checked_ready(message: HostMessage, offered: Collection[str]) -> Ready:
    """`message` as the host's acceptance of a hello that offered `offered`.

    Raises:
        RemoteProtocolError: it is not a `connection/ready` of version 1, or it selected a
            capability the client did not offer.
    """
    if not isinstance(message, Ready) or message.selected_version != PROTOCOL_VERSION:
        raise RemoteProtocolError(
            f"code-mode host returned an invalid handshake response: {message!r}"
        )
    unknown = set(message.capabilities) - set(offered)
    if unknown:
        raise RemoteProtocolError(
            f"code-mode host selected capabilities the client did not offer: {sorted(unknown)}"
        )
    return message
