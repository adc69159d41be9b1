"""The connection's own frames: the handshake (hello, ready, the refusals) and the heartbeat.

They belong to the connection, not to any session or request (`_messages` holds those and
the unions of both directions).
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from .._api import AdmissionLimits
from ._message_base import Message as _Message
from ._message_base import check_capabilities as _check_capabilities
from ._message_base import check_versions as _check_versions


class Hello(_Message, tag="connection/hello", frozen=True, omit_defaults=True):
    """First client frame: versions and capabilities the client speaks.

    Parameters:
        codemode_version: the client's codemode version; a host that checks it (one listening
            on a socket) refuses another version, or none, with `VersionMismatch`.
        token: the shared secret of a host that requires one (`Unauthorized` when it is
            wrong or missing). Both are sent only when set: a spawned host's hello has neither.
    """

    supported_versions: list[int]
    required_capabilities: list[str] = msgspec.field(default_factory=list)
    optional_capabilities: list[str] = msgspec.field(default_factory=list)
    codemode_version: str | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        _check_versions(self.supported_versions)
        _check_capabilities(self.required_capabilities)
        _check_capabilities(self.optional_capabilities)
        both = set(self.required_capabilities) & set(self.optional_capabilities)
        if both:
            raise ValueError(
                f"code-mode capabilities listed as required and optional: {sorted(both)}"
            )


class Ready(_Message, tag="connection/ready", frozen=True, omit_defaults=True):
    """The host's answer to a hello; `admission`: the limits it applies to this connection
    (sent only by hosts that advertise them)."""

    selected_version: int
    capabilities: list[str]
    admission: AdmissionLimits | None = None

    def __post_init__(self) -> None:
        _check_versions([self.selected_version])
        _check_capabilities(self.capabilities)


class NoCompatibleVersion(_Message, tag="noCompatibleVersion", frozen=True):
    supported_versions: list[int]

    def __post_init__(self) -> None:
        _check_versions(self.supported_versions)


class MissingRequiredCapability(_Message, tag="missingRequiredCapability", frozen=True):
    capability: str

    def __post_init__(self) -> None:
        _check_capabilities([self.capability])


class InvalidHello(_Message, tag="invalidHello", frozen=True):
    message: str


class Unauthorized(_Message, tag="unauthorized", frozen=True):
    """The hello's token is missing or wrong (the text never holds a token)."""

    message: str


class VersionMismatch(_Message, tag="versionMismatch", frozen=True):
    """The client runs another codemode version than the host (`client_version` None: the
    hello named none)."""

    host_version: str
    client_version: str | None


RejectReason: TypeAlias = (
    NoCompatibleVersion | MissingRequiredCapability | InvalidHello | Unauthorized | VersionMismatch
)


def describe_rejection(reason: RejectReason) -> str:
    """The text a client reports for a refused hello."""
    prefix = "code-mode host rejected the handshake"
    match reason:
        case Unauthorized(message=message):
            return f"{prefix}: {message}"
        case VersionMismatch(host_version=host, client_version=client):
            return (
                f"{prefix}: the host runs codemode {host} and this client codemode"
                f" {client or '(unknown)'}; install the same codemode version on both sides"
            )
    return f"{prefix}: {reason!r}"


class Rejected(_Message, tag="connection/rejected", frozen=True):
    reason: RejectReason


class Ping(_Message, tag="connection/ping", frozen=True):
    """Are you there? Answered with `Pong` at once. Either side, with `HEARTBEAT_CAPABILITY`."""


class Pong(_Message, tag="connection/pong", frozen=True):
    """The answer to a `Ping`."""
