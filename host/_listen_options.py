"""The listening options of `codemode-host`: `--listen`, `--token-file`, `--tls-cert`, `--tls-key`,
the bounds on connections (`--hello-timeout`, `--max-waiting-connections`,
`--max-connections`; `_listen_limits.py`) and the grace of a cut connection (`--resume-grace`).

Checked with the other options (`_options.py`): a mistake prints one line and exits with
status 2 before anything listens.

Rules:
1. The token comes from the file `--token-file` names, else from the environment variable
   `CODEMODE_HOST_TOKEN` (removed from the host's environment once read); never from the
   command line, where other users of the machine could read it. It is one word, surrounding
   whitespace removed.
2. A host listening on TCP beyond loopback without a token refuses to start (as `codemode mcp
   serve` does): anyone who can reach it could run code in it. A Unix socket (mode 0600) or a
   loopback address may go without one.
3. `--tls-cert` and `--tls-key` come together, and only with `--listen`; the certificate and
   key are loaded here, so a bad one is a usage error, not a failed connection later.
4. The connection bounds are positive and apply only with `--listen`; `--resume-grace` is at
   least 0 (0: a cut connection is not resumed).
"""

from __future__ import annotations

import argparse
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from codemode_host._listen_limits import (
    HELLO_TIMEOUT,
    MAX_CONNECTIONS,
    MAX_WAITING_CONNECTIONS,
    RESUME_GRACE,
)

if TYPE_CHECKING:  # loaded by `listen_settings` when it listens: a stdio host does without it
    from codemode._trio._sockets import HostAddress

TOKEN_VARIABLE = "CODEMODE_HOST_TOKEN"


@dataclass(frozen=True)
class ListenSettings:
    """Where and how a listening host serves (the token is left out of its repr)."""

    address: HostAddress
    token: str | None = field(default=None, repr=False)
    ssl_context: ssl.SSLContext | None = None
    hello_timeout: float = HELLO_TIMEOUT
    max_waiting_connections: int = MAX_WAITING_CONNECTIONS
    max_connections: int = MAX_CONNECTIONS
    resume_grace: float = RESUME_GRACE


def add_listen_options(parser: argparse.ArgumentParser) -> None:
    """Add the listening options to `parser`, in a group of their own."""
    group = parser.add_argument_group(
        "listening", "serve clients on a socket instead of stdin/stdout (docs/scaling.md)"
    )
    group.add_argument(
        "--listen",
        metavar="ADDRESS",
        default=None,
        help="tcp://HOST:PORT (PORT 0: any free port) or unix:PATH; once listening, prints "
        "`codemode-host listening on ADDRESS` on stdout; stops on SIGTERM or SIGINT",
    )
    group.add_argument(
        "--token-file",
        metavar="PATH",
        default=None,
        help=f"file holding the token clients must send (else ${TOKEN_VARIABLE}); required "
        "to listen beyond loopback",
    )
    group.add_argument("--tls-cert", metavar="PATH", default=None, help="TLS certificate (PEM)")
    group.add_argument("--tls-key", metavar="PATH", default=None, help="TLS private key (PEM)")
    group.add_argument(
        "--hello-timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help=f"close a connection that has not completed its hello by then (default"
        f" {HELLO_TIMEOUT:g})",
    )
    group.add_argument(
        "--max-waiting-connections",
        metavar="N",
        type=int,
        default=None,
        help="connections at once that have not completed their hello; past it the oldest is"
        f" closed (default {MAX_WAITING_CONNECTIONS})",
    )
    group.add_argument(
        "--max-connections",
        metavar="N",
        type=int,
        default=None,
        help=f"clients connected at once; one more is closed after its hello (default"
        f" {MAX_CONNECTIONS})",
    )
    group.add_argument(
        "--resume-grace",
        metavar="SECONDS",
        type=float,
        default=None,
        help="how long a cut connection keeps its sessions and running cells for its client to"
        f" reconnect and resume it; 0: freed at once (default {RESUME_GRACE:g})",
    )


def listen_settings(
    parser: argparse.ArgumentParser, arguments: argparse.Namespace
) -> ListenSettings | None:
    """The settings the parsed options name (None: serve stdin/stdout); a mistake ends the
    program through `parser.error` (status 2)."""
    bounds = ("hello_timeout", "max_waiting_connections", "max_connections")
    if arguments.listen is None:
        for name in ("token_file", "tls_cert", "tls_key", "resume_grace", *bounds):
            if getattr(arguments, name) is not None:
                parser.error(f"--{name.replace('_', '-')} only applies with --listen")
        return None
    from codemode._trio._sockets import parse_address

    try:
        address = parse_address(arguments.listen)
    except ValueError as error:
        parser.error(f"--listen: {error}")
    token = _token(parser, arguments.token_file)
    if token is None and not address.is_loopback:
        parser.error(
            f"refusing to listen on {address} without a token: only a loopback address or a"
            f" Unix socket may be served without one (--token-file or ${TOKEN_VARIABLE})"
        )
    for name in bounds:
        value = getattr(arguments, name)
        if value is not None and not value > 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value:g}")
    grace = RESUME_GRACE if arguments.resume_grace is None else arguments.resume_grace
    if not grace >= 0:
        parser.error(f"--resume-grace must be 0 or more, got {grace:g}")
    return ListenSettings(
        address=address,
        token=token,
        ssl_context=_tls(parser, arguments),
        hello_timeout=arguments.hello_timeout or HELLO_TIMEOUT,
        max_waiting_connections=arguments.max_waiting_connections or MAX_WAITING_CONNECTIONS,
        max_connections=arguments.max_connections or MAX_CONNECTIONS,
        resume_grace=grace,
    )


def _token(parser: argparse.ArgumentParser, path: str | None) -> str | None:
    """Rule 1."""
    from_environment = os.environ.pop(TOKEN_VARIABLE, None)
    if path is None:
        text, where = from_environment, f"${TOKEN_VARIABLE}"
        if text is None:
            return None
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            parser.error(f"cannot read the token file {path}: {error}")
        where = f"the token file {path}"
    token = text.strip()
    if not token or any(ch.isspace() for ch in token):
        parser.error(f"{where} must hold one token, without spaces")
    return token


def _tls(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> ssl.SSLContext | None:
    """Rule 3."""
    cert, key = arguments.tls_cert, arguments.tls_key
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        parser.error("--tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        parser.error(f"cannot load the TLS certificate {cert} and key {key}: {error}")
    return context
