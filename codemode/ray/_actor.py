"""The Ray actor that runs one `codemode-host --listen` process on its node.

It runs in a Ray worker process, not under trio: blocking calls, `subprocess` and two daemon
threads, the accepted exception to the trio-only rule (docs/architecture.md), confined to
`codemode.ray`.

Rules:
1. The host listens on port 0 of `listen_host`, by default the node's IP as Ray knows it
   (`ray.util.get_node_ip_address()`); the actor reads the one line the host prints once it
   listens and reports `tcp://IP:PORT`, with the node's IP when the host listens on every
   interface (`0.0.0.0`).
2. The token reaches the host through its environment (`CODEMODE_HOST_TOKEN`), never its
   command line. `CODEMODE_HOST_PARENT` names the actor's process, so a host whose actor died
   (`ray.kill`, a crash) stops by itself.
3. A host that exits while the actor did not stop it takes the actor down (`os._exit`), so
   Ray restarts the actor, and with it a fresh host on a new port.
4. The host's stderr is copied to the actor's (Ray's worker log); its last lines are kept for
   the error raised when the host exits before it listens.
5. `stop()` ends the host: SIGTERM, `STOP_GRACE` seconds, SIGKILL; it is reaped before
   `stop()` returns.
"""

from __future__ import annotations

import collections
import ipaddress
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

from .._trio._sockets import HostAddress, parse_address
from .._wire import PARENT_VARIABLE
from ..process import default_host_command

TOKEN_VARIABLE = "CODEMODE_HOST_TOKEN"
LISTENING = b"codemode-host listening on "
STOP_GRACE = 5.0
"""Seconds the host has to stop on SIGTERM before it is killed (rule 5)."""
TAIL_LINES = 20


class HostActor:
    """One `codemode-host --listen` process on this node (made a Ray actor by the provider).

    Args:
        listen_host: the IP the host listens on (None: the node's IP; `0.0.0.0`: every
            interface).
        token: the host's shared secret (None: none; only on a loopback IP, rule 2 of
            `codemode_host._listen_options`).
        host_options: more `codemode-host` options (e.g. `--tls-cert PATH --tls-key PATH`,
            paths on the node).
        host_command: the argv that starts the host (None: this Python's `-m codemode_host`).

    Raises:
        RuntimeError: the host exited before it listened (its last stderr lines in the text).
    """

    def __init__(
        self,
        *,
        listen_host: str | None = None,
        token: str | None = None,
        host_options: Sequence[str] = (),
        host_command: Sequence[str] | None = None,
    ) -> None:
        import ray  # the worker's: Ray imported it already

        node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        listen = HostAddress("tcp", host=listen_host or node_ip, port=0)
        environment = dict(os.environ)
        environment.pop(TOKEN_VARIABLE, None)
        if token is not None:
            environment[TOKEN_VARIABLE] = token
        environment[PARENT_VARIABLE] = str(os.getpid())
        command = [*(host_command or default_host_command()), "--listen", str(listen)]
        self._stopping = False
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._process = subprocess.Popen(
            [*command, *host_options],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
        )
        assert self._process.stdout is not None
        assert self._process.stderr is not None
        copier = threading.Thread(target=self._copy, args=(self._process.stderr,), daemon=True)
        copier.start()
        with self._process.stdout as stdout:
            line = stdout.readline()
        if not line.startswith(LISTENING):
            status = self._process.wait()
            copier.join()
            tail = "".join(self._tail).strip()
            raise RuntimeError(
                f"codemode-host exited with status {status} before listening: {tail}"
            )
        bound = parse_address(line[len(LISTENING) :].decode().strip())
        host = node_ip if _unspecified(bound.host) else bound.host
        self._address = str(HostAddress("tcp", host=host, port=bound.port))
        threading.Thread(target=self._watch, daemon=True).start()

    def address(self) -> str:
        """Where the host listens: `tcp://IP:PORT` (rule 1)."""
        return self._address

    def pids(self) -> tuple[int, int]:
        """The actor's process id and its host's."""
        return os.getpid(), self._process.pid

    def stop(self) -> int:
        """Rule 5: stop the host; its exit status."""
        self._stopping = True
        if self._process.poll() is None:
            self._process.terminate()
            try:
                return self._process.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                self._process.kill()
        return self._process.wait()

    def _copy(self, stderr: IO[bytes]) -> None:
        """Rule 4."""
        with stderr:
            for line in stderr:
                text = line.decode(errors="replace")
                self._tail.append(text)
                sys.stderr.write(text)
                sys.stderr.flush()

    def _watch(self) -> None:
        """Rule 3."""
        status = self._process.wait()
        if not self._stopping:
            print(
                f"codemode-host exited with status {status}: ending its actor for Ray to restart",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
