"""The sandbox surface of a cell, on both providers: what JavaScript can reach.

- The own property names of `globalThis` equal design.md, runtime 3.2's allowlist exactly, but
  for four names that list holds and codemode does not (`REFERENCE_ONLY`, each said why).
- Every object reachable from `globalThis` (and from the intrinsics only syntax reaches:
  generator and async function prototypes, iterators, a CallSite, `import.meta`), through
  properties and prototypes, has exactly the own keys pinned in `sandbox_surface.json`. 3.2
  lists only globals; the pinned file is the allowlist below the global object (the
  ECMAScript builtins of QuickJS-ng 0.17, reviewed: its non-standard extras are in `EXTRAS`).
  A new engine or prelude that adds a name fails here until the file is regenerated
  (`python -m tests.test_sandbox_surface > tests/sandbox_surface.json`) and reviewed.
- No prelude helper is reachable: the only functions that are not builtins are the added
  globals and the enabled tools (and the prelude's `CallSite.getFunction` stand-in). The
  prelude's functions read as native code, as V8's native helpers do (the engine drops their
  source text), so the walk tells them from builtins by their file name (`<prelude>`,
  `<prelude-images>`).
- `Function`, `eval` and dynamic `import()` reach nothing else: code they build sees the same
  global object, no host or OS name, and every import is refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import pytest
import trio

from codemode import Completed, Session
from tests.delegates import RecordingDelegate
from tests.sessions import run, texts, tool
from tests.test_cell_globals import ADDED_GLOBALS, ALLOWED_GLOBALS

HERE = Path(__file__).resolve().parent
WALK = (HERE / "sandbox_walk.js").read_text()
PINNED = HERE / "sandbox_surface.json"
TOOLS = [tool("echo", "Echo its input.")]

REFERENCE_ONLY = {
    "Intl": "QuickJS-ng has no Intl (design.md, runtime 3.16)",
    "Temporal": "QuickJS-ng 0.17 has no Temporal",
    "__codexContentItems": "an internal of the reference's V8 runtime, not a cell API",
    "add_content": "an internal of the reference's V8 runtime, not a cell API",
}
"""Names of the 3.2 allowlist that codemode's global object does not have."""

EXTRAS = {
    "globalThis.Error": {"captureStackTrace", "prepareStackTrace", "stackTraceLimit"},
    "globalThis.Object<proto>": {"fileName", "lineNumber", "columnNumber"},
}
"""QuickJS-ng's non-standard names on reachable objects, reviewed: V8 (the reference's engine)
has the Error ones too; `Function.prototype.fileName` and friends give a function's source
position. None reaches beyond the cell (CallSite `getFunction` is neutered by the prelude).
Beside them the pinned surface holds TC39 proposals QuickJS-ng ships early (`Iterator.zip`,
`Iterator.prototype.chunks` / `windows`, `Math.sumPrecise`, `Map.prototype.getOrInsert`,
immutable `ArrayBuffer`s, `JSON.rawJSON`, `Uint8Array.fromBase64`, `RegExp.escape`,
`Error.isError`): pure computation, kept."""

HOST_NAMES = [
    "require", "process", "module", "exports", "std", "os", "print", "console", "scriptArgs",
    "fetch", "XMLHttpRequest", "WebSocket", "Deno", "Bun", "navigator", "importScripts",
    "performance", "queueMicrotask", "Atomics", "SharedArrayBuffer", "WebAssembly", "global",
    "setInterval", "bjson", "__loadScript", "native", "dispatch", "config",
]  # fmt: skip
"""Names of OS, host or prelude objects that no built code may see."""

IMPORTS = [
    "qjs:std", "qjs:os", "qjs:bjson", "std", "os", "fs", "node:fs", "child_process",
    "./exec_main.mjs", "/etc/passwd", "file:///etc/passwd", "https://example.com/x.js",
    "data:text/javascript,export default 1",
]  # fmt: skip


def _succeeded(response: object) -> None:
    assert isinstance(response, Completed), response
    assert response.error_text is None, response.error_text


class Walk(msgspec.Struct, frozen=True):
    """What `sandbox_walk.js` prints."""

    surface: dict[str, list[str]]
    functions: list[str]


async def _surface(session: Session) -> Walk:
    response = await run(session, RecordingDelegate(), WALK, tools=TOOLS)
    _succeeded(response)
    return msgspec.json.decode(texts(response)[0], type=Walk)


async def test_global_names_equal_the_reference_allowlist(session: Session) -> None:
    with trio.fail_after(20):
        walked = await _surface(session)
    surface = walked.surface
    names = {name for name in surface["globalThis"] if not name.startswith("[")}
    assert set(REFERENCE_ONLY) <= ALLOWED_GLOBALS
    assert names == ALLOWED_GLOBALS - set(REFERENCE_ONLY)
    assert names >= ADDED_GLOBALS


async def test_every_reachable_object_has_the_pinned_keys(session: Session) -> None:
    with trio.fail_after(20):
        walked = await _surface(session)
    surface = walked.surface
    pinned = json.loads(PINNED.read_text())
    assert set(surface) == set(pinned), set(surface) ^ set(pinned)
    for path, names in surface.items():
        assert names == pinned[path], path
    for path, extras in EXTRAS.items():
        assert extras <= set(surface[path]), path
    print(f"sandbox surface: {len(surface)} objects, {sum(map(len, surface.values()))} keys")


async def test_no_prelude_helper_is_reachable(session: Session) -> None:
    with trio.fail_after(20):
        walked = await _surface(session)
    roots = {"(generator function)", "(async function)", "(async generator function)"}
    ours = {f"globalThis.{name}" for name in ADDED_GLOBALS - {"tools", "ALL_TOOLS"}}
    ours |= {"globalThis.tools.echo", "(call site)<proto>.getFunction"}
    assert set(walked.functions) == roots | ours


async def test_stack_frames_give_no_function(session: Session) -> None:
    # Before the prelude neutered CallSite.getFunction, a timer callback reached the
    # prelude's dispatcher this way and settled its own tool call with a forged result.
    source = """
        let sites;
        Error.prepareStackTrace = (_error, callSites) => callSites;
        await new Promise((resolve) => setTimeout(() => { sites = new Error().stack; resolve(); }, 1));
        const inText = [];
        text({ toJSON() { inText.push(...new Error().stack); return 1; } });
        Error.prepareStackTrace = undefined;
        text(JSON.stringify([...sites, ...inText].map((site) => typeof site.getFunction())));
        text(JSON.stringify(inText.map((site) => site.getFunctionName())));
    """
    with trio.fail_after(20):
        response = await run(session, RecordingDelegate(), source, tools=TOOLS)
    _succeeded(response)
    kinds = set(json.loads(texts(response)[1]))
    assert kinds == {"undefined"}
    assert "outputText" in texts(response)[2]  # the helpers' frames were there, unreachable


async def test_a_helper_reads_as_native_code(session: Session) -> None:
    # The prelude's source text is not part of its bytecode: a helper shows no internals.
    source = "text(String(text)); text(String(tools.echo)); text(String(setTimeout));"
    with trio.fail_after(20):
        response = await run(session, RecordingDelegate(), source, tools=TOOLS)
    _succeeded(response)
    assert texts(response) == [
        "function text() {\n    [native code]\n}",
        "function () {\n    [native code]\n}",
        "function setTimeout() {\n    [native code]\n}",
    ]


BUILDERS = {
    "Function": "Function({body})()",
    "indirect eval": "(0, eval)({iife})",
    "direct eval": "eval({iife})",
    "GeneratorFunction": "Object.getPrototypeOf(function* () {{}}).constructor({body})().next().value",
    "AsyncFunction": "await Object.getPrototypeOf(async function () {{}}).constructor({body})()",
}  # fmt: skip


@pytest.mark.parametrize("builder", sorted(BUILDERS))
async def test_built_code_sees_the_same_globals_and_no_host(session: Session, builder: str) -> None:
    body = (
        "const names = " + json.dumps(HOST_NAMES) + ";"
        " return [Function('return this')() === globalThis,"
        " names.filter((name) => typeof globalThis[name] !== 'undefined'"
        " || (() => { try { return eval(name) !== undefined; } catch { return false; } })())];"
    )
    template = BUILDERS[builder]
    expression = template.format(body=json.dumps(body), iife=json.dumps(f"(() => {{{body}}})()"))
    source = f"const [same, found] = {expression}; text(same); text(JSON.stringify(found));"
    with trio.fail_after(20):
        response = await run(session, RecordingDelegate(), source)
    _succeeded(response)
    assert texts(response) == ["true", "[]"]


@pytest.mark.parametrize("where", ["module", "Function", "eval", "timer"])
async def test_every_dynamic_import_is_refused(session: Session, where: str) -> None:
    attempt = {
        "module": "await import(name)",
        "Function": "await Function('name', 'return import(name)')(name)",
        "eval": "await eval('import(name)')",
        "timer": "await new Promise((ok, no) => setTimeout(() => import(name).then(ok, no)))",
    }[where]
    source = (
        f"for (const name of {json.dumps(IMPORTS)}) {{"
        f" try {{ {attempt}; text('imported ' + name); }} catch (error) {{ text(String(error)); }} }}"
    )
    with trio.fail_after(20):
        response = await run(session, RecordingDelegate(), source)
    _succeeded(response)
    assert texts(response) == [f"Unsupported import in exec: {name}" for name in IMPORTS]


async def _print_surface() -> None:
    import codemode

    async with codemode.open_in_process_provider() as provider:
        walked = await _surface(await provider.create_session())
    surface = walked.surface
    lines = [f"  {json.dumps(path)}: {json.dumps(names)}" for path, names in surface.items()]
    sys.stdout.write("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    trio.run(_print_surface)
