"""Who may connect: the hello's token and codemode version (HostConnection rule 8), in memory."""

from __future__ import annotations

import pytest

from codemode.protocol import (
    NEED_DATA,
    ClientConnection,
    FrameDecoder,
    FrameEncoder,
    HandshakeCompleted,
    HandshakeRejected,
    Hello,
    HostConnection,
    HostMessage,
    InvalidHello,
    NoCompatibleVersion,
    Ready,
    Rejected,
    Unauthorized,
    VersionMismatch,
    describe_rejection,
)

SECRET = "s3cret-token"


def _handshake(client: ClientConnection, host: HostConnection) -> tuple[object, object, bytes]:
    """Run one hello through `host`: its event, the client's event, and the host's bytes."""
    host.receive_data(client.data_to_send())
    host_event = host.next_event()
    answer = host.data_to_send()
    client.receive_data(answer)
    return host_event, client.next_event(), answer


def _frames(data: bytes) -> list[HostMessage]:
    decoder: FrameDecoder[HostMessage] = FrameDecoder(HostMessage)  # type: ignore[arg-type]
    decoder.receive_data(data)
    frames = []
    while (frame := decoder.next_message()) is not NEED_DATA:
        frames.append(frame)
    return frames


def test_a_spawned_hosts_hello_is_unchanged() -> None:
    # No version and no token: neither field is on the wire (omit_defaults), so the frame a
    # process provider sends decodes anywhere a plain hello does.
    plain = FrameEncoder().encode(Hello(supported_versions=[1]))
    assert b"codemode_version" not in plain
    assert b"token" not in plain
    assert ClientConnection().data_to_send() == plain


def test_the_right_token_and_version_are_admitted() -> None:
    client = ClientConnection(codemode_version="1.2.3", token=SECRET)
    host = HostConnection(token=SECRET, codemode_version="1.2.3")
    host_event, client_event, answer = _handshake(client, host)
    assert isinstance(host_event, HandshakeCompleted)
    assert isinstance(client_event, HandshakeCompleted)
    assert isinstance(_frames(answer)[0], Ready)


@pytest.mark.parametrize(
    ("token", "text"),
    [
        (None, "the host requires a token and the client sent none"),
        ("wrong", "the client's token is wrong"),
        ("", "the client's token is wrong"),
        (SECRET + "x", "the client's token is wrong"),
        ("sécret", "the client's token is wrong"),  # not ASCII: compared as bytes
    ],
)
def test_a_missing_or_wrong_token_is_refused_without_echo(token: str | None, text: str) -> None:
    client = ClientConnection(codemode_version="1.2.3", token=token)
    host = HostConnection(token=SECRET, codemode_version="1.2.3")
    host_event, client_event, answer = _handshake(client, host)
    reason = Unauthorized(message=text)
    assert host_event == HandshakeRejected(reason=reason)
    assert client_event == HandshakeRejected(reason=reason)
    assert _frames(answer) == [Rejected(reason=reason)]
    assert SECRET.encode() not in answer
    assert not client.is_open
    assert describe_rejection(reason) == f"code-mode host rejected the handshake: {text}"


def test_the_token_is_checked_before_the_version() -> None:
    # An unauthenticated client learns nothing about the host, not even its version.
    client = ClientConnection(codemode_version="0.0.1", token="wrong")
    host = HostConnection(token=SECRET, codemode_version="1.2.3")
    _, client_event, answer = _handshake(client, host)
    assert isinstance(client_event, HandshakeRejected)
    assert isinstance(client_event.reason, Unauthorized)
    assert b"1.2.3" not in answer


@pytest.mark.parametrize("version", ["1.2.4", None])
def test_another_codemode_version_is_refused(version: str | None) -> None:
    client = ClientConnection(codemode_version=version)
    host = HostConnection(codemode_version="1.2.3")
    _, client_event, _ = _handshake(client, host)
    reason = VersionMismatch(host_version="1.2.3", client_version=version)
    assert client_event == HandshakeRejected(reason=reason)
    shown = version or "(unknown)"
    assert describe_rejection(reason) == (
        "code-mode host rejected the handshake: the host runs codemode 1.2.3 and this client"
        f" codemode {shown}; install the same codemode version on both sides"
    )


def test_a_host_that_checks_nothing_ignores_both_fields() -> None:
    client = ClientConnection(codemode_version="9.9.9", token="anything")
    host_event, client_event, _ = _handshake(client, HostConnection())
    assert isinstance(host_event, HandshakeCompleted)
    assert isinstance(client_event, HandshakeCompleted)


def test_older_rejections_keep_their_text() -> None:
    reason = NoCompatibleVersion(supported_versions=[1])
    assert describe_rejection(reason) == f"code-mode host rejected the handshake: {reason!r}"
    invalid = InvalidHello(message="first message must be connection/hello")
    assert describe_rejection(invalid).startswith("code-mode host rejected the handshake: ")
