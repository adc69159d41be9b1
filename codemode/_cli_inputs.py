"""What the `codemode` command reads: `--tools MODULE:ATTR` tool sources and the cell's file.

Rules:
1. `MODULE` is a dotted module name, imported with the working directory first on `sys.path`
   (a console script does not put it there), so `examples.weather_tools` works from the
   repository's root; `ATTR` may be dotted too.
2. The attribute must be a tool source (a `Toolbox`, a `combine(...)` result, anything with
   `definitions()` and the `SessionDelegate` methods), an instance and not a class; several
   are combined.
3. Whatever importing the module raises, `SystemExit` included, is a mistake of the command
   line (Ctrl-C aside): the module may not end the command with a status of its own.
4. The cell's file is UTF-8; a byte-order mark at its start is dropped, so that the pragma
   line after it is still the first line.
5. Every mistake is a `UsageError` whose text fits on one line: the command prints it and exits
   with status 2, without a traceback.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ._combine import CombinedTools, ToolSource, combine
from .errors import CodeModeError


class UsageError(CodeModeError):
    """A mistake in the command line or in what it names."""


def load_tools(specs: Sequence[str]) -> CombinedTools:
    """The tool sources named by `--tools` options, combined into one delegate.

    Raises:
        UsageError: a malformed option, an import that fails, a missing attribute, an attribute
            that is not a tool source, or two sources defining the same tool name.
    """
    sources = [_load_one(spec) for spec in specs]
    try:
        return combine(*sources)
    except ValueError as error:
        raise UsageError(str(error)) from error


def _load_one(spec: str) -> ToolSource:
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(
            f"--tools expects MODULE:ATTR (like examples.weather_tools:toolbox), got {spec!r}"
        )
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        raise UsageError(
            "--tools expects a dotted module name (like examples.weather_tools), "
            f"got {module_name!r}"
        )
    working_directory = os.getcwd()
    if working_directory not in sys.path:
        sys.path.insert(0, working_directory)
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # whatever the module raises while it is imported (rule 3)
        raise UsageError(
            _one_line(f"cannot import {module_name}: {type(error).__name__}: {error}")
        ) from error
    try:
        value: object = functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        raise UsageError(f"module {module_name} has no attribute {attribute!r}") from None
    if isinstance(value, type):
        # A class has the protocol's methods as plain functions, so the check below passes it.
        raise UsageError(
            f"{spec} is a class, not a toolbox: name an instance of it (a codemode.Toolbox or "
            f"the result of codemode.combine), such as `toolbox = {value.__name__}()`"
        )
    if not isinstance(value, ToolSource):
        raise UsageError(
            f"{spec} is not a toolbox (a codemode.Toolbox or the result of codemode.combine), "
            f"got {type(value).__name__}"
        )
    return value


def read_source(path: str) -> str:
    """The text of the cell's file, without a byte-order mark (rule 4).

    Raises:
        UsageError: the file cannot be read or is not UTF-8 text.
    """
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise UsageError(f"cannot read {path}: not UTF-8 text ({error.reason})") from error


def _one_line(text: str) -> str:
    return " ".join(text.split())
