"""mypy --strict over the packages, the tests and the scripts; then mypy's stubtest, which checks
the engine's stub (`host/_quickjs.pyi`) against the built module `codemode_host._quickjs`.

The folder `host/` is imported as `codemode_host`, a name mypy cannot derive from the path, so
this links `build/typecheck/codemode_host` to it and lets mypy find it there (`mypy_path`).
stubtest imports the built extension, so it needs the project installed (the README's set-up).
Run as `python -m tests.typecheck` (`nox -s typecheck` does).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    link = ROOT / "build" / "typecheck" / "codemode_host"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(ROOT / "host", target_is_directory=True)
    command = [sys.executable, "-m", "mypy", "codemode", str(link.relative_to(ROOT))]
    command += ["codemode_cli.py", "tests", "benchmarks", "examples", "noxfile.py"]
    # The configuration gives stubtest the mypy_path above: without it stubtest finds no stub
    # for the module and reports success without comparing anything.
    stubtest = [sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", "pyproject.toml"]
    stubtest += ["codemode_host._quickjs"]
    statuses = [subprocess.run(c, cwd=ROOT, check=False).returncode for c in (command, stubtest)]
    return max(statuses)


if __name__ == "__main__":
    sys.exit(main())
