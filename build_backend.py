"""The build backend: setuptools' own, which also asks for what mypyc needs when the build
compiles (`CODEMODE_COMPILE=1`, setup.py).

mypyc compiles by type-checking the modules first, so it needs mypy itself and the packages
whose types the compiled modules use. The versions are the dev extra's mypy and the runtime
dependencies' lower bounds (pyproject.toml).
"""

from __future__ import annotations

import os
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (the hooks this module does not change)

COMPILE_REQUIRES = ["mypy==2.4.1", "trio>=0.31.0", "msgspec>=0.18.6"]


def _compiling() -> list[str]:
    return COMPILE_REQUIRES if os.environ.get("CODEMODE_COMPILE") == "1" else []


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return [*_setuptools.get_requires_for_build_wheel(config_settings), *_compiling()]


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    return [*_setuptools.get_requires_for_build_editable(config_settings), *_compiling()]
