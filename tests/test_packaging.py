"""The package list of pyproject.toml names every package in the source tree, and its package
data every script the engine reads.

An editable install finds every package and file by its directory; a built wheel holds only the
ones pyproject.toml lists, so one missing there would be missing for every user.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_every_package_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for name, directory in config["package-dir"].items():
        base = ROOT / directory
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base)
            found.add(".".join([name, *relative.parts]))
    assert found == listed


def test_every_script_the_engine_reads_is_package_data() -> None:
    # The engine reads its JavaScript files at import; a wheel without one fails at once.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["package-data"]["codemode_host"])
    scripts = {path.relative_to(ROOT / "host").as_posix() for path in ROOT.glob("host/**/*.js")}
    assert scripts
    assert scripts <= listed, scripts - listed
