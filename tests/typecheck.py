"""mypy --strict over the packages, the tests and the scripts.

The folder `host/` is imported as `codemode_host`, a name mypy cannot derive from the path, so
this links `build/typecheck/codemode_host` to it and lets mypy find it there (`mypy_path`).
Run as `python -m tests.typecheck`.
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
    return subprocess.run(command, cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
