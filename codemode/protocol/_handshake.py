"""The handshake's checks, both halves: the hello a client sends and its checks of the host's
answer; the host's answer to a hello (rules 1 and 8 of `_host.py`).

Pure functions of the messages: the connections queue what they decide and move their states.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection

from ._capabilities import PROTOCOL_VERSION
from ._connection_messages import (
    Hello,
    MissingRequiredCapability,
    NoCompatibleVersion,
    Ready,
    RejectReason,
    Unauthorized,
    VersionMismatch,
)
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


def answer_hello(
    hello: Hello, supported: frozenset[str], token: str | None, codemode_version: str | None
) -> frozenset[str] | RejectReason:
    """The capabilities a host selects for `hello`, or why it refuses it: the shared secret
    (compared in constant time; the text never holds a token), then the codemode version,
    then the protocol version and the required capabilities."""
    if token is not None:
        if hello.token is None:
            return Unauthorized(message="the host requires a token and the client sent none")
        if not hmac.compare_digest(hello.token.encode(errors="replace"), token.encode()):
            return Unauthorized(message="the client's token is wrong")
    if codemode_version is not None and hello.codemode_version != codemode_version:
        return VersionMismatch(host_version=codemode_version, client_version=hello.codemode_version)
    if PROTOCOL_VERSION not in hello.supported_versions:
        return NoCompatibleVersion(supported_versions=[PROTOCOL_VERSION])
    offered = supported & {*hello.required_capabilities, *hello.optional_capabilities}
    for capability in hello.required_capabilities:
        if capability not in offered:
            return MissingRequiredCapability(capability=capability)
    return offered
