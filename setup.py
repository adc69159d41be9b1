"""Build of the QuickJS engine binding, `codemode_host._quickjs`.

The binding (`host/engine/_quickjs.c`) is ours; the QuickJS-ng 0.17.0 C sources are not kept in
this repository (docs/design.md, design 2). The build obtains them from the pinned
`quickjs-ng==0.17.0.2` source distribution through pip, checks the archive's sha256, unpacks the
engine sources into `build/quickjs-ng-0.17.0.2/` (reused by later builds) and compiles them
together with the binding.

Environment switches:
- `CODEMODE_QUICKJS_SDIST=/path/quickjs_ng-0.17.0.2.tar.gz`: use that archive instead of asking
  pip (offline builds); its sha256 is checked all the same.
- `CODEMODE_DEBUG_BUILD=1`: `-O1 -g` with assertions on, so that a JS value the binding leaks
  aborts at runtime teardown instead of leaking silently (docs/engine.md, "Checking the binding").
- `CODEMODE_SANITIZE=1`: also build with AddressSanitizer and UndefinedBehaviorSanitizer, at
  `-O1 -g` (the sanitizers' usual level: far quicker to compile than `-O3`, with readable reports),
  with every UndefinedBehaviorSanitizer finding fatal (`-fno-sanitize-recover=undefined`). The
  module then loads only with the sanitizer runtime preloaded (`nox -s sanitize` does it;
  docs/engine.md, "Checking the binding").
- `CODEMODE_COMPILE=1`: also compile the modules on a cell's path (`COMPILED_MODULES`) with
  mypyc, into extension modules that stand beside their sources in the wheel and are imported
  instead of them (docs/compiled.md). Wheels only: an editable install is refused, because a
  compiled module in the source tree would shadow every later edit of its source. The build
  then needs mypy, trio and msgspec (`build_backend.py` asks for them).

The compile and link flags are written to `engine-flags.txt` in the build's temporary folder, and
the extension depends on that file: a build folder reused with other flags (`nox -s sanitize`
keeps its own) rebuilds the extension instead of keeping one built with the old flags.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

QUICKJS_REQUIREMENT = "quickjs-ng==0.17.0.2"
QUICKJS_ARCHIVE = "quickjs_ng-0.17.0.2.tar.gz"
QUICKJS_SHA256 = "43d2e48272208721a7aaea8e3f02d4b9318f12ef20cc4f5421b59d9a470706ef"
QUICKJS_UNITS = ["quickjs.c", "libregexp.c", "libunicode.c", "dtoa.c"]
ENGINE_EXTENSION = "codemode_host._quickjs"

# The path of a cell through the client and the host, from the sans-IO connections to the
# caller's answer and the engine's events: the Python the instruction counts put on the two trio
# threads (docs/compiled.md). Not the messages (msgspec Structs cannot be native classes); not
# the client's session (`codemode/_wire/_session.py`, whose checked requests go on in the
# compiled `_session_core.py`), where the application's values arrive and its checks must name
# what was wrong before a compiled signature refuses a value with mypyc's own TypeError; not the
# engine's wrapper (`host/engine/_engine.py`: mypyc has no async generators); not a call
# worker's loop (`codemode/_trio/_worker_task.py`: trio's KI protection marks a function's code
# object, which a compiled function has not); not the API's request checks
# (`codemode/_checks.py`: a compiled read of a user's attribute refuses a wrong type itself).
# `tests/test_compiled_modules.py` checks the rules a compiled module must keep.
COMPILED_MODULES = [
    "codemode/_identifiers.py",
    "codemode/_trio/_alarms.py",
    "codemode/_trio/_callbacks.py",
    "codemode/_trio/_once.py",
    "codemode/_trio/_heartbeat.py",
    "codemode/protocol/_capabilities.py",
    "codemode/protocol/_message_checks.py",
    "codemode/protocol/_statetable.py",
    "codemode/protocol/_states.py",
    "codemode/protocol/_codec.py",
    "codemode/protocol/_endpoint.py",
    "codemode/protocol/_client.py",
    "codemode/protocol/_host.py",
    "codemode/protocol/_refusals.py",
    "codemode/protocol/_cells.py",
    "codemode/protocol/_cellview.py",
    "codemode/protocol/_operations.py",
    "codemode/protocol/_reverse.py",
    "codemode/protocol/_replay.py",
    "codemode/protocol/_recent.py",
    "codemode/protocol/_routes.py",
    "codemode/protocol/_handshake.py",
    "codemode/_wire/_link_core.py",
    "codemode/_wire/_link.py",
    "codemode/_wire/_slots.py",
    "codemode/_wire/_stream.py",
    "codemode/_wire/_delegates.py",
    "codemode/_wire/_binding.py",
    "codemode/_wire/_session_core.py",
    "codemode/_trio/_oneshot.py",
    "codemode/_trio/_writer.py",
    "codemode/_trio/_reader.py",
    "host/server.py",
    "host/_requests.py",
    "host/_answers.py",
    "host/_operation.py",
    "host/_remote_delegate.py",
    "host/engine/_cell.py",
    "host/engine/_events.py",
    "host/runtime/_admission.py",
    "host/runtime/_budget.py",
    "host/runtime/_callee.py",
    "host/runtime/_calls.py",
    "host/runtime/_cell.py",
    "host/runtime/_frontier.py",
    "host/runtime/_jswait.py",
    "host/runtime/_life.py",
    "host/runtime/_observer.py",
    "host/runtime/_output.py",
    "host/runtime/_phases.py",
    "host/runtime/_session.py",
    "host/runtime/_share.py",
    "host/runtime/_timers.py",
    "host/runtime/_watch.py",
    "host/runtime/_watched.py",
]
# `host/` is the package `codemode_host`, a name mypyc cannot derive from the path: it compiles
# the host's modules through a link of that name (the one `tests/typecheck.py` makes for mypy).
HOST_LINK = Path("build") / "typecheck" / "codemode_host"

HERE = Path(__file__).resolve().parent
SOURCE_DIR = Path("build") / "quickjs-ng-0.17.0.2"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_archive(into: Path) -> Path:
    local = os.environ.get("CODEMODE_QUICKJS_SDIST")
    if local:
        return Path(local)
    # pip comes from this build environment (a build requirement). --no-build-isolation:
    # preparing the sdist's metadata needs only setuptools, which this
    # build environment already has, so pip does not set up a second one.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            "--dest",
            str(into),
            QUICKJS_REQUIREMENT,
        ],
        check=True,
    )
    return into / QUICKJS_ARCHIVE


def quickjs_sources() -> Path:
    """Return the folder holding the verified QuickJS-ng sources, fetching them once."""
    target = HERE / SOURCE_DIR
    if all((target / unit).is_file() for unit in QUICKJS_UNITS):
        return SOURCE_DIR
    with tempfile.TemporaryDirectory() as tmp:
        archive = _download_archive(Path(tmp))
        actual = _sha256(archive)
        if actual != QUICKJS_SHA256:
            raise RuntimeError(
                f"{archive.name}: sha256 {actual} does not match the pinned {QUICKJS_SHA256}"
            )
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if "/upstream-quickjs/" in m.name and m.isfile()]
            tar.extractall(unpacked, members=members, filter="data")
        (upstream,) = {p.parent for p in unpacked.glob("*/upstream-quickjs/quickjs.c")}
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(upstream, target)
    return SOURCE_DIR


class BuildWithQuickJS(build_ext):
    """build_ext that fetches the engine sources first and compiles units in parallel."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        src = quickjs_sources()
        for ext in self.extensions:
            if ext.name == ENGINE_EXTENSION:
                ext.sources.extend(str(src / unit) for unit in QUICKJS_UNITS)
                ext.include_dirs.append(str(src))
                ext.depends.append(self._flags_stamp(ext))
        if os.environ.get("CODEMODE_COMPILE") == "1":
            self._add(self._compiled())
        self._drop_stale_extensions()
        super().run()

    def _drop_stale_extensions(self) -> None:
        """Delete the extension modules a reused build folder holds but this build does not
        make: the wheel packs the whole folder, and a module compiled by an earlier build (one
        since dropped from COMPILED_MODULES, or every one of them when this build compiles
        none) would be imported instead of its source, or fail to load."""
        if self.inplace:
            return
        made = {Path(self.get_ext_fullpath(ext.name)).resolve() for ext in self.extensions}
        build_lib = Path(self.build_lib)
        for package in ("codemode", "codemode_host"):
            for path in (build_lib / package).rglob("*.so"):
                if path.resolve() not in made:
                    path.unlink()
        for path in build_lib.glob("codemode__mypyc*.so"):
            if path.resolve() not in made:
                path.unlink()

    def _add(self, extensions: list[Extension]) -> None:
        """Add extensions after the options were finalized: mypyc's are made only when the
        build runs (pip reads setup.py and finalizes this command in several processes, before
        mypyc is installed in some), and setuptools prepares each of its extensions then."""
        for ext in extensions:
            full_name = ext._full_name = self.get_ext_fullname(ext.name)  # type: ignore[attr-defined]
            self.ext_map[full_name] = ext
            ext._links_to_dynamic = ext._needs_stub = False  # type: ignore[attr-defined]
            ext._file_name = self.get_ext_filename(full_name)  # type: ignore[attr-defined]
        self.extensions.extend(extensions)

    def _compiled(self) -> list[Extension]:
        """mypyc's extensions of COMPILED_MODULES."""
        if self.inplace or getattr(self, "editable_mode", False):
            raise RuntimeError(
                "CODEMODE_COMPILE=1 builds a wheel, not an editable install: a compiled module"
                " in the source tree would be imported instead of the source you edit"
            )
        from mypyc.build import mypycify

        # The optional extras (OpenTelemetry, Pillow) are not in the build's environment: what
        # the compiled modules reach of them is typed `Any` here. `nox -s typecheck` is the
        # project's type check, with every extra installed.
        relaxed = ["--ignore-missing-imports", "--no-warn-return-any", "--no-warn-unused-ignores"]
        link = HERE / HOST_LINK
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(HERE / "host", target_is_directory=True)
        paths = [
            str(HOST_LINK / path.removeprefix("host/")) if path.startswith("host/") else path
            for path in COMPILED_MODULES
        ]
        extensions: list[Extension] = mypycify(
            [*relaxed, *paths],
            group_name="codemode",
            target_dir=str(Path("build") / "mypyc"),
        )
        return extensions

    def _flags_stamp(self, ext: Extension) -> str:
        # build_ext skips an extension newer than its sources whatever flags built it; a file
        # rewritten whenever the flags change makes a change of flags count as a change of source.
        stamp = Path(self.build_temp) / "engine-flags.txt"
        flags = "\n".join([*ext.extra_compile_args, "--", *ext.extra_link_args]) + "\n"
        if not stamp.is_file() or stamp.read_text() != flags:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.write_text(flags)
        return str(stamp)


def _flags() -> tuple[list[str], list[str]]:
    compile_args = ["-std=gnu11", "-fvisibility=hidden", "-pthread"]
    link_args = ["-pthread"]
    if os.environ.get("CODEMODE_DEBUG_BUILD") == "1":
        compile_args += ["-O1", "-g", "-UNDEBUG"]
    else:
        # Flags given here come after CPython's own CFLAGS, so this -O3 wins.
        compile_args += ["-O3"]
    if os.environ.get("CODEMODE_SANITIZE") == "1":
        sanitize = [
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer",
        ]
        # After -O3 or the debug build's -O1, so this level wins.
        compile_args += [*sanitize, "-O1", "-g"]
        link_args += sanitize
    return compile_args, link_args


_compile_args, _link_args = _flags()

setup(
    ext_modules=[
        Extension(
            ENGINE_EXTENSION,
            sources=["host/engine/_quickjs.c"],
            extra_compile_args=_compile_args,
            extra_link_args=_link_args,
            define_macros=[("_GNU_SOURCE", None)],
        )
    ],
    cmdclass={"build_ext": BuildWithQuickJS},
)
