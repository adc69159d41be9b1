"""The rules a module compiled by mypyc must keep (setup.py `COMPILED_MODULES`, docs/compiled.md).

mypyc compiles these modules without complaint where they break them, and the compiled module
then behaves differently from its source: the suite run against the compiled build (`nox -s
compiled`) finds it only if a test happens to take that path. These checks read the sources.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def compiled_modules() -> list[str]:
    """The paths setup.py compiles (its `COMPILED_MODULES`, a literal list)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "COMPILED_MODULES"
        ):
            paths = ast.literal_eval(node.value)
            assert isinstance(paths, list)
            return [str(path) for path in paths]
    raise AssertionError("setup.py has no COMPILED_MODULES list")


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function and method in `tree`, nested ones included."""
    return [
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def rebound_exception_names(source: str) -> list[str]:
    """`function: name` for each function that binds one name in `except ... as name` clauses
    of different types. mypyc gives the variable the type of its first clause, so a later
    clause catching anything else raises `TypeError` instead of running."""
    found = []
    for function in _functions(ast.parse(source)):
        types: dict[str, set[str]] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.ExceptHandler) and node.name and node.type is not None:
                types.setdefault(node.name, set()).add(ast.unparse(node.type))
        found += [f"{function.name}: {name}" for name, kinds in types.items() if len(kinds) > 1]
    return found


def _tested_for_none(test: ast.expr) -> set[str]:
    """The attributes `test` compares with `is None` (`self._x is None`, also inside `and`)."""
    return {
        ast.unparse(node.left)
        for node in ast.walk(test)
        if isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Attribute)
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.Is)
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    }


def stale_none_tests(source: str) -> list[str]:
    """`function: attribute` for each `if` or `while` that tests an attribute `is None` and, in
    its block, reads it again after a call or an `await` without assigning it first. mypy keeps
    the test's narrowing across the call, which may have changed the attribute (another task, a
    callback); mypyc trusts it and raises `TypeError` on the value it finds. A `while` block
    runs its test again after its body: the read is the test itself."""
    found = []
    for function in _functions(ast.parse(source)):
        for block in ast.walk(function):
            if not isinstance(block, ast.If | ast.While):
                continue
            attributes = _tested_for_none(block.test)
            body = [node for statement in block.body for node in ast.walk(statement)]
            calls = [n.lineno for n in body if isinstance(n, ast.Call | ast.Await)]
            if not attributes or not calls:
                continue
            assigned = {
                ast.unparse(n)
                for n in body
                if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            }
            read_again = {
                ast.unparse(n)
                for n in body
                if isinstance(n, ast.Attribute)
                and isinstance(n.ctx, ast.Load)
                and n.lineno > min(calls)
                and ast.unparse(n) in attributes
            }
            if isinstance(block, ast.While):
                read_again |= attributes
            found += [f"{function.name}: {name}" for name in sorted(read_again - assigned)]
    return found


def _optional_attributes(tree: ast.AST) -> set[str]:
    """The `self.` attributes a module declares with `None` among their types (`self._x: T |
    None = ...` or a class-level `_x: T | None`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and "None" in ast.unparse(node.annotation):
            target = node.target
            if isinstance(target, ast.Attribute):
                names.add(ast.unparse(target))
            elif isinstance(target, ast.Name):
                names.add(f"self.{target.id}")
    return names


def stale_assignments(source: str) -> list[str]:
    """`function: attribute` for each attribute declared optional that a function assigns a
    value other than `None` and reads again after an `await` or a call of one of its object's
    methods, with no assignment between. mypy narrows the attribute to the value's type from
    the assignment on and keeps it across the call, which may have reset it (another task, a
    callback); mypyc trusts the narrowing and raises `TypeError` on the `None` it finds. Read it through a method instead.
    The order is the source's, lines and loops taken as written: a heuristic that errs on the
    side of reporting."""
    tree = ast.parse(source)
    optional = _optional_attributes(tree)
    found = []
    for function in _functions(tree):
        nodes = [node for statement in function.body for node in ast.walk(statement)]
        # Where something else may run: an `await`, or a method of the object itself. Taken at
        # its last line: its arguments are read before it runs.
        calls = sorted(
            n.end_lineno or n.lineno
            for n in nodes
            if isinstance(n, ast.Await)
            or (isinstance(n, ast.Call) and ast.unparse(n.func).startswith("self."))
        )
        stores: dict[str, list[tuple[int, bool]]] = {}
        for node in nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    name = ast.unparse(target)
                    if name in optional:
                        is_none = isinstance(node.value, ast.Constant) and node.value.value is None
                        stores.setdefault(name, []).append((node.lineno, not is_none))
        stale = set()
        for node in nodes:
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
                continue
            name = ast.unparse(node)
            before = [store for store in stores.get(name, []) if store[0] < node.lineno]
            if not before:
                continue
            line, narrowed = max(before)
            if narrowed and any(line < call < node.lineno for call in calls):
                stale.add(f"{function.name}: {name}")
        found += sorted(stale)
    return found


def test_the_list_names_modules_that_exist() -> None:
    paths = compiled_modules()
    assert paths, "nothing is compiled"
    assert len(set(paths)) == len(paths)
    assert [path for path in paths if not (ROOT / path).is_file()] == []


@pytest.mark.parametrize("path", compiled_modules())
def test_an_exception_name_keeps_one_type_in_a_function(path: str) -> None:
    assert rebound_exception_names((ROOT / path).read_text()) == []


@pytest.mark.parametrize("path", compiled_modules())
def test_a_none_test_is_not_trusted_after_a_call(path: str) -> None:
    assert stale_none_tests((ROOT / path).read_text()) == []


@pytest.mark.parametrize("path", compiled_modules())
def test_an_assigned_attribute_is_not_trusted_after_a_call(path: str) -> None:
    assert stale_assignments((ROOT / path).read_text()) == []


def test_the_check_finds_a_stale_assignment() -> None:
    source = """
class Reading:
    _spare: int | None = None

    def __init__(self) -> None:
        self._holder: Worker | None = None
        self._count = 0

    async def run(self, worker: Worker) -> None:
        self._holder = worker
        self._count = 1
        await self._step()
        if self._holder is not worker:
            return
        self._holder = None
        await self._step()
        self._holder.cancel()
        self._spare = 3
        self._spare = None
        self.call()
        print(self._spare, self._count)

    def fresh(self, worker: Worker) -> None:
        self._holder = worker
        self._holder.start()
"""
    assert stale_assignments(source) == ["run: self._holder"]


def test_the_check_finds_a_stale_none_test() -> None:
    source = """
async def f(self) -> None:
    if self._done is None and self._failed is None:
        while self._done is None:
            await self._event.wait()
    if self._scope is None:
        self._scope = make()
        use(self._scope)
    if self._value is None:
        self.refresh()
        return self._value
"""
    assert sorted(stale_none_tests(source)) == ["f: self._done", "f: self._value"]


def test_the_check_finds_a_rebound_name() -> None:
    source = """
def f() -> None:
    try:
        pass
    except KeyError as error:
        pass
    except BaseException as error:
        pass
    try:
        pass
    except (KeyError, ValueError) as other:
        pass
"""
    assert rebound_exception_names(source) == ["f: error"]
