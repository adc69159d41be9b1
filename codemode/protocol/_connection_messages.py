"""The connection's own frames: the handshake (hello, ready, the refusals), the heartbeat, and
the resume of a cut connection (acknowledgements, resume, goodbye).

They belong to the connection, not to any session or request (`_messages` holds those and
the unions of both directions). None of them is sequenced for a resume (`_replay`): they are
about the stream they travel on.
"""

from __future__ import annotations

from typing import Annotated, TypeAlias

import msgspec

from .._api import AdmissionLimits
from ._message_base import Message as _Message
from ._message_checks import check_capabilities as _check_capabilities
from ._message_checks import check_versions as _check_versions


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


Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
"""A number of sequenced frames (`_replay`)."""


class Ready(_Message, tag="connection/ready", frozen=True, omit_defaults=True):
    """The host's answer to a hello; `admission`: the limits it applies to this connection
    (sent only by hosts that advertise them).

    With `RESUME_CAPABILITY`: `resume_token`, the secret that resumes this connection once
    (never logged), and `resume_grace_ms`, how long the host keeps a cut connection's sessions.
    """

    selected_version: int
    capabilities: list[str]
    admission: AdmissionLimits | None = None
    resume_token: str | None = None
    resume_grace_ms: Count | None = None

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


class ResumeRefused(_Message, tag="resumeRefused", frozen=True):
    """A `connection/resume` the host cannot honour: an unknown or spent token (its grace
    ended, or it was presented before), or counts that do not match what the host holds."""

    message: str


RejectReason: TypeAlias = (
    NoCompatibleVersion
    | MissingRequiredCapability
    | InvalidHello
    | Unauthorized
    | VersionMismatch
    | ResumeRefused
)


def describe_rejection(reason: RejectReason) -> str:
    """The text a client reports for a refused hello."""
    prefix = "code-mode host rejected the handshake"
    match reason:
        case Unauthorized(message=message):
            return f"{prefix}: {message}"
        case ResumeRefused(message=message):
            return f"code-mode host refused to resume the connection: {message}"
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


class Ack(_Message, tag="connection/ack", frozen=True):
    """Both ways, with `RESUME_CAPABILITY`: this side received `received` sequenced frames;
    the peer may forget them (it keeps the others to replay after a cut)."""

    received: Count


class Resume(_Message, tag="connection/resume", frozen=True):
    """The first frame of a new connection that continues a cut one, instead of a hello:
    the token the host gave (in `Ready` or the last `Resumed`) and how many sequenced frames
    the client received. Nothing else is sent until the answer."""

    token: str
    received: Count


class Resumed(_Message, tag="connection/resumed", frozen=True):
    """The host's answer to a `Resume`: how many sequenced frames it received, and the token
    of the next resume (the one presented is spent). Each side then replays the frames the
    other did not receive, in order."""

    received: Count
    token: str


class Goodbye(_Message, tag="connection/goodbye", frozen=True):
    """Either side, with `RESUME_CAPABILITY`: it ends the connection on purpose, so the end
    of the stream that follows is the end (the host frees the sessions at once; the client
    does not try to resume)."""
