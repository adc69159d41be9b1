"""The MCP servers the MCP tests talk to: the npm `server-everything` and our small SDK server.

`everything_command()` (the `everything` fixture of conftest.py) installs
`@modelcontextprotocol/server-everything` (pinned) with npm into a cache folder outside the
repository on first use (`$CODEMODE_TEST_CACHE`, default `~/.cache/codemode-tests`), one
process at a time (a lock file beside it: pytest-xdist's workers). Without `node` or `npm` the
calling test is skipped, with the reason; when npm is there but the install fails, the test
fails.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

EVERYTHING_PACKAGE = "@modelcontextprotocol/server-everything"
EVERYTHING_VERSION = "2026.8.31"
INSTALL_TIMEOUT = 600
TEST_SERVER = Path(__file__).with_name("mcp_test_server.py")


def cache_folder() -> Path:
    configured = os.environ.get("CODEMODE_TEST_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "codemode-tests"


def everything_command() -> list[str]:
    """The argv of server-everything on stdio, installed first if needed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("the MCP tests against server-everything need node and npm on PATH")
    folder = cache_folder() / f"server-everything-{EVERYTHING_VERSION}"
    entry = folder / "node_modules" / EVERYTHING_PACKAGE / "dist" / "index.js"
    if not entry.is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        # One install at a time (pytest-xdist's workers, two runs at once): the others wait,
        # then find it installed.
        with (folder.parent / f"{folder.name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not entry.is_file():
                _install(npm, folder)
    return [node, str(entry), "stdio"]


def _install(npm: str, folder: Path) -> None:
    # Installed beside its final place, then renamed: an interrupted install never looks
    # complete to the next run.
    staging = Path(tempfile.mkdtemp(prefix="install-", dir=folder.parent))
    spec = f"{EVERYTHING_PACKAGE}@{EVERYTHING_VERSION}"
    command = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(staging), spec]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.fail(f"npm install {spec} took more than {INSTALL_TIMEOUT} s")
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.fail(f"npm install {spec} failed:\n{result.stdout}\n{result.stderr}")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def sdk_server_command(*arguments: str) -> list[str]:
    """The argv of `tests/mcp_test_server.py` (our own SDK server)."""
    return [sys.executable, str(TEST_SERVER), *arguments]
