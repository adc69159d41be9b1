"""docs/architecture.md stays true: the import rules of each layer, and the state tables."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from codemode_host.runtime import INITIAL, LIFECYCLE, OBSERVATION

from codemode.protocol import StateTable
from codemode.protocol._cellview import OBSERVATION as CLIENT_OBSERVATION
from codemode.protocol._states import CONNECTION, SESSION
from tests.typecheck import ROOT

DOC = ROOT / "docs" / "architecture.md"


def _imports(path: Path, package: str) -> set[str]:
    """The absolute names of the modules (and `module.name`s) `path` imports."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: -(node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _modules(folder: str, package: str) -> list[tuple[Path, str, set[str]]]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        relative = path.relative_to(ROOT / folder).with_suffix("")
        parts = [package, *relative.parts]
        if parts[-1] == "__init__":
            parts.pop()
            owner = ".".join(parts)
        else:
            owner = ".".join(parts[:-1])
        found.append((path, owner, _imports(path, owner)))
    return found


def _ours(names: set[str], prefix: str) -> set[str]:
    return {name for name in names if name == prefix or name.startswith(prefix + ".")}


def test_the_protocol_imports_no_trio_no_host() -> None:
    for path, _, names in _modules("codemode/protocol", "codemode.protocol"):
        codemode = {n for n in _ours(names, "codemode") if not n.startswith("codemode.protocol")}
        # The report and the trace context are plain msgspec schemas the frames carry.
        allowed = ("codemode._api", "codemode.errors", "codemode.observability._report")
        assert all(n.startswith(allowed) for n in codemode), (path, codemode)
        assert not _ours(names, "trio"), path
        assert not _ours(names, "codemode_host"), path


def test_only_the_in_process_provider_imports_the_host() -> None:
    for path, _, names in _modules("codemode", "codemode"):
        if path.name == "inprocess.py":
            assert not _ours(names, "codemode_host.server"), path
            continue
        assert not _ours(names, "codemode_host"), path


MCP_MAY_IMPORT = (
    "codemode._api",
    "codemode.errors",
    "codemode.model",
    "codemode._toolbox",
    "codemode._combine",
    "codemode._governance",
    "codemode._identifiers",
    "codemode._trio",
    "codemode._cli_inputs",
    "codemode.observability",
)


def test_the_mcp_package_imports_only_its_documented_layers() -> None:
    for path, _, names in _modules("codemode/mcp", "codemode.mcp"):
        for name in _ours(names, "codemode"):
            if name.startswith("codemode.mcp"):
                continue
            front_door = name.count(".") == 1 and not name.split(".")[1].startswith("_")
            front_door = front_door and name.split(".")[1] not in {
                "process",
                "inprocess",
                "protocol",
            }
            if name == "codemode" or front_door:
                continue  # a name of the front door (`from .. import open_process_provider`)
            allowed = any(name == a or name.startswith(a + ".") for a in MCP_MAY_IMPORT)
            assert allowed, (path, name)
            assert not name.startswith("codemode.model._"), (path, name)  # its front door only
        assert not _ours(names, "codemode_host"), path


def test_only_the_cli_imports_the_optional_mcp_package() -> None:
    for path, _, names in _modules("codemode", "codemode"):
        if "mcp" in path.relative_to(ROOT / "codemode").parts or path.name == "cli.py":
            continue
        assert not _ours(names, "codemode.mcp"), path
        assert not _ours(names, "mcp"), path


def test_the_host_imports_only_the_front_door_the_protocol_and_the_trio_helpers() -> None:
    # `codemode.observability` is a front door of its own: the cells' reports and spans. The
    # runtime runs in-process calls, so it sets `_governance.approval_reporter` for them.
    allowed = (
        "codemode.errors",
        "codemode.protocol",
        "codemode._trio",
        "codemode.observability",
        "codemode._governance",
    )
    for path, owner, names in _modules("host", "codemode_host"):
        for name in _ours(names, "codemode"):
            front_door = name.count(".") == 1 and not name.split(".")[1].startswith("_")
            front_door = front_door or name == "codemode"
            if front_door and name not in {
                "codemode.process",
                "codemode.inprocess",
                "codemode.model",
            }:
                continue
            assert name.startswith(allowed), (path, name)
        if owner.startswith("codemode_host.runtime"):
            protocol = _ours(names, "codemode.protocol") - {"codemode.protocol"}
            assert protocol <= {"codemode.protocol.StateTable"}, (path, protocol)
        if owner.startswith("codemode_host.engine"):
            assert not _ours(names, "codemode_host.runtime"), path
            assert {n for n in _ours(names, "codemode") if n != "codemode"} <= {
                "codemode._trio",
                "codemode._trio.Alarms",
                "codemode._trio.open_service_nursery",
            }, path


WIRE_MAY_IMPORT = (
    "codemode._api",
    "codemode._checks",
    "codemode._idempotency",
    "codemode.errors",
    "codemode.protocol",
    "codemode._trio",
    "codemode._text",
    "codemode._tool_threads",
    "codemode._providers",
    "codemode._closing",
    "codemode.observability",
    "codemode._governance",
)
PROVIDER_PACKAGES = ("codemode.process", "codemode.remote", "codemode.ray")


def _within(name: str, prefixes: tuple[str, ...]) -> str | None:
    """The prefix of `prefixes` that `name` is or lies under, if any."""
    return next((p for p in prefixes if name == p or name.startswith(p + ".")), None)


def test_the_wire_knows_no_provider() -> None:
    for path, _, names in _modules("codemode/_wire", "codemode._wire"):
        for name in _ours(names, "codemode") - _ours(names, "codemode._wire"):
            assert _within(name, WIRE_MAY_IMPORT), (path, name)
        assert not _ours(names, "codemode_host"), path


def test_the_providers_share_the_wire_not_each_others_private_names() -> None:
    # The remote provider once subclassed the process provider's session through its private
    # members; what they share is `codemode._wire`, and each names the other by its front door.
    for path, owner, names in _modules("codemode", "codemode"):
        package = _within(owner, PROVIDER_PACKAGES)
        if package is None:
            continue
        for name in _ours(names, "codemode"):
            other = _within(name, tuple(p for p in PROVIDER_PACKAGES if p != package))
            if other is None:
                continue
            inside = name[len(other) :].split(".")[1:]
            assert not any(part.startswith("_") for part in inside), (path, name)


@pytest.mark.parametrize(
    "table",
    [LIFECYCLE, OBSERVATION, INITIAL, CLIENT_OBSERVATION, CONNECTION, SESSION],
    ids=lambda table: table.name,
)
def test_the_documented_state_tables_are_the_code(table: StateTable[object, object]) -> None:  # type: ignore[type-var]
    text = DOC.read_text()
    match = re.search(
        rf"<!-- table: {re.escape(table.name)} -->\n(.*?)\n<!-- end table -->", text, re.S
    )
    assert match is not None, f"docs/architecture.md has no table {table.name!r}"
    assert match.group(1) == table.markdown()


def test_only_the_optional_ray_package_imports_ray() -> None:
    for path, owner, names in _modules("codemode", "codemode"):
        if owner.startswith("codemode.ray"):
            assert not _ours(names, "codemode_host"), path
            assert not _ours(names, "codemode.mcp"), path
            continue
        assert not _ours(names, "ray"), path
        assert not _ours(names, "codemode.ray"), path


AIO_MAY_IMPORT = ("codemode._tool_threads",)


def test_the_asyncio_bridge_imports_the_front_door_and_the_tool_threads() -> None:
    for path, _, names in _modules("codemode/aio", "codemode.aio"):
        for name in _ours(names, "codemode"):
            if name.startswith("codemode.aio"):
                continue
            front_door = name.count(".") == 1 and not name.split(".")[1].startswith("_")
            front_door = front_door and name.split(".")[1] not in {
                "process",
                "inprocess",
                "protocol",
                "remote",
                "mcp",
                "ray",
            }
            if name == "codemode" or front_door or name.startswith("codemode.model."):
                assert not name.startswith("codemode.model._"), (path, name)
                continue
            allowed = any(name == a or name.startswith(a + ".") for a in AIO_MAY_IMPORT)
            assert allowed, (path, name)
        assert not _ours(names, "codemode_host"), path


def test_only_the_asyncio_bridge_and_the_integrations_import_asyncio() -> None:
    for path, owner, names in _modules("codemode", "codemode"):
        if owner.startswith(("codemode.aio", "codemode.integrations")):
            continue
        assert not _ours(names, "asyncio"), path
        assert not _ours(names, "codemode.aio"), path


FRAMEWORKS = ("pydantic_ai", "agents")


def test_the_integrations_import_the_front_doors_only() -> None:
    for path, _, names in _modules("codemode/integrations", "codemode.integrations"):
        for name in _ours(names, "codemode"):
            if name.startswith("codemode.integrations"):
                continue
            parts = name.split(".")
            private = any(part.startswith("_") for part in parts[1:3])
            inner = parts[1] if len(parts) > 1 else ""
            assert not private, (path, name)
            assert inner not in {"process", "inprocess", "protocol", "remote", "mcp", "ray"}, (
                path,
                name,
            )
        assert not _ours(names, "codemode_host"), path


def test_only_the_integrations_import_the_agent_frameworks() -> None:
    for path, owner, names in _modules("codemode", "codemode"):
        if owner.startswith("codemode.integrations"):
            continue
        for framework in FRAMEWORKS:
            assert not _ours(names, framework), path
        assert not _ours(names, "codemode.integrations"), path
