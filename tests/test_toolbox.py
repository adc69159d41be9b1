"""Typed Python tools (`Toolbox`) and `combine`: schemas from signatures, argument validation
seen by the cell's `catch`, failures, sync tools cancelled, notifications, routing.

The end-to-end tests run cells on both providers (the `session` fixture)."""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec
import pytest
import trio

import codemode
from codemode import (
    Completed,
    LiveCell,
    NestedToolCall,
    Session,
    Terminated,
    Toolbox,
    ToolDefinition,
    ToolError,
    ToolName,
    combine,
)
from tests.delegates import RecordingDelegate
from tests.sessions import execute, run, texts


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(msgspec.Struct):
    """A point on the map."""

    lat: float
    lon: float


class Reading(msgspec.Struct):
    city: str
    degrees: float
    unit: Unit


class Tree(msgspec.Struct):
    name: str
    children: list[Tree] = []


def definition(toolbox: Toolbox) -> ToolDefinition:
    (only,) = toolbox.definitions()
    return only


# ---- schemas -----------------------------------------------------------------------------------


def test_schema_of_plain_parameters_with_defaults() -> None:
    toolbox = Toolbox()

    @toolbox.tool
    def temperature(city: str, days: int = 3, metric: bool = True) -> float:
        """Today's temperature.

        More lines stay in the description.
        """
        return 0.0

    assert definition(toolbox) == ToolDefinition(
        name="temperature",
        tool_name=ToolName.plain("temperature"),
        description="Today's temperature.\n\nMore lines stay in the description.",
        input_schema={
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "default": 3},
                "metric": {"type": "boolean", "default": True},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
        output_schema={"type": "number"},
    )
    assert temperature("Oslo") == 0.0  # the decorator returns the function unchanged


def test_schema_of_optional_enum_literal_and_described_parameters() -> None:
    toolbox = Toolbox()

    @toolbox.tool
    async def convert(
        value: Annotated[float, msgspec.Meta(description="The value to convert.")],
        unit: Unit,
        precision: Literal["coarse", "fine"] = "coarse",
        note: str | None = None,
    ) -> list[str]:
        """Convert a value."""
        return []

    schema = definition(toolbox).input_schema
    assert schema == {
        "type": "object",
        "properties": {
            "value": {"type": "number", "description": "The value to convert."},
            "unit": {"$ref": "#/$defs/Unit"},
            "precision": {"enum": ["coarse", "fine"], "default": "coarse"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        "required": ["value", "unit"],
        "additionalProperties": False,
        "$defs": {"Unit": {"title": "Unit", "enum": ["celsius", "fahrenheit"]}},
    }
    assert definition(toolbox).output_schema == {"type": "array", "items": {"type": "string"}}


def test_schema_of_nested_structs_and_lists_keeps_their_definitions() -> None:
    toolbox = Toolbox()

    @toolbox.tool
    def readings(places: list[Place], around: Place | None = None) -> list[Reading]:
        """Readings at places."""
        return []

    place = {
        "title": "Place",
        "description": "A point on the map.",
        "type": "object",
        "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
        "required": ["lat", "lon"],
    }
    schema = definition(toolbox).input_schema
    # msgspec lists a union's members in an order that changed between its releases.
    around = schema["properties"]["around"]
    around["anyOf"].sort(key=lambda member: "$ref" not in member)
    assert schema == {
        "type": "object",
        "properties": {
            "places": {"type": "array", "items": {"$ref": "#/$defs/Place"}},
            "around": {"anyOf": [{"$ref": "#/$defs/Place"}, {"type": "null"}], "default": None},
        },
        "required": ["places"],
        "additionalProperties": False,
        "$defs": {"Place": place},
    }
    output = definition(toolbox).output_schema
    assert output["items"] == {"$ref": "#/$defs/Reading"}
    assert set(output["$defs"]) == {"Reading", "Unit"}


def test_struct_result_is_the_root_of_the_output_schema() -> None:
    toolbox = Toolbox()

    @toolbox.tool
    def here() -> Place:
        """Where we are."""
        return Place(lat=0, lon=0)

    @toolbox.tool
    def tree() -> Tree:
        """A recursive result: its definition stays for the references inside."""
        return Tree(name="root")

    here_schema, tree_schema = (d.output_schema for d in toolbox.definitions())
    assert here_schema["title"] == "Place"
    assert here_schema["required"] == ["lat", "lon"]
    assert "$defs" not in here_schema
    assert tree_schema["properties"]["children"]["items"] == {"$ref": "#/$defs/Tree"}
    assert tree_schema["$defs"]["Tree"]["title"] == "Tree"


def test_tool_without_parameters_takes_an_empty_object() -> None:
    toolbox = Toolbox()

    @toolbox.tool
    async def ping() -> None:
        """Answer null."""

    assert definition(toolbox).input_schema == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }
    assert definition(toolbox).output_schema == {"type": "null"}


def test_name_and_namespace_options() -> None:
    toolbox = Toolbox()

    @toolbox.tool(name="lookup")
    def find(q: str) -> str:
        """Find something."""
        return q

    @toolbox.tool(namespace="maps")
    def route(start: str, end: str) -> list[str]:
        """A route."""
        return [start, end]

    lookup, namespaced = toolbox.definitions()
    assert (lookup.name, lookup.tool_name) == ("lookup", ToolName.plain("lookup"))
    assert (namespaced.name, namespaced.tool_name) == (
        "maps__route",
        ToolName.namespaced("maps", "route"),
    )
    assert find("x") == "x"


class Service:
    """Tools that share state: bound methods."""

    def __init__(self) -> None:
        self.calls = 0

    async def count(self, step: int = 1) -> int:
        """Count the calls."""
        self.calls += step
        return self.calls


async def test_bound_methods_are_tools(session: Session) -> None:
    service = Service()
    toolbox = Toolbox()
    toolbox.tool(service.count)
    assert definition(toolbox).input_schema["properties"] == {
        "step": {"type": "integer", "default": 1}
    }
    source = "await tools.count(); text(await tools.count({ step: 5 }));"
    with trio.fail_after(10):
        response = await run(session, toolbox, source, tools=toolbox.definitions())
    assert texts(response) == ["6"]


# ---- definition errors ---------------------------------------------------------------------


def _no_hint(city) -> str:  # type: ignore[no-untyped-def]
    """Missing annotation."""
    return str(city)


def _no_return(city: str):  # type: ignore[no-untyped-def]
    """Missing return annotation."""
    return city


def _star_args(*cities: str) -> str:
    """*args."""
    return ""


def _star_kwargs(**options: str) -> str:
    """**kwargs."""
    return ""


def _positional_only(city: str, /) -> str:
    """Positional-only."""
    return city


def _no_docstring(city: str) -> str:
    return city


class _Opaque:
    pass


def _unsupported(thing: _Opaque) -> str:
    """A type msgspec cannot describe."""
    return ""


def _unresolved(city: Missing) -> str:  # type: ignore[name-defined]  # noqa: F821
    """A forward reference to nothing."""
    return ""


def _mutable_default(cities: list[str] = ["Paris"]) -> str:  # noqa: B006
    """A non-empty list default, which msgspec refuses."""
    return ""


def _opaque_return(city: str) -> _Opaque:
    """A return type msgspec cannot describe."""
    return _Opaque()


def _mangled(city: str, __secret: str) -> str:
    """A parameter name Python mangles."""
    return ""


def _generator(city: str) -> Any:
    """A generator."""
    yield city


@pytest.mark.parametrize(
    ("function", "error", "message"),
    [
        (_no_hint, TypeError, "tool _no_hint: parameter city has no type annotation"),
        (_no_return, TypeError, "tool _no_return: the return value has no type annotation"),
        (
            _star_args,
            TypeError,
            r"tool _star_args: parameter cities collects positional arguments \(\*args\); a tool takes named arguments \(one JSON object\)",
        ),
        (_star_kwargs, TypeError, r"parameter options collects keyword arguments \(\*\*kwargs\)"),
        (_positional_only, TypeError, "parameter city is positional-only"),
        (
            _no_docstring,
            TypeError,
            "tool _no_docstring has no docstring: it is the description the model reads",
        ),
        (
            _unsupported,
            TypeError,
            "(?s)tool _unsupported: parameter thing has no JSON Schema: .*type <class '.*_Opaque'> is not supported",
        ),
        (
            _mutable_default,
            TypeError,
            r"^tool _mutable_default: parameter cities has a non-empty mutable default \(\['Paris'\]\); default to None and build the value in the function$",
        ),
        (
            _opaque_return,
            TypeError,
            "(?s)^tool _opaque_return: its return value has no JSON Schema: .*type <class '.*_Opaque'> is not supported",
        ),
        (
            _mangled,
            TypeError,
            "^tool _mangled: parameter __secret cannot be a field of its arguments: ",
        ),
        (
            _unresolved,
            TypeError,
            "tool _unresolved: cannot resolve its annotations: NameError: name 'Missing' is not defined",
        ),
        (_generator, TypeError, "a tool must be a plain or async function"),
        (len, TypeError, "a tool must be a plain or async function, got <built-in function len>"),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_definition_errors_are_raised_at_decoration(
    function: Callable[..., Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Toolbox().tool(function)


def test_names_must_be_unique_and_not_reserved() -> None:
    toolbox = Toolbox()

    @toolbox.tool(name="get-weather")
    def first() -> str:
        """One."""
        return ""

    def second() -> str:
        """Two."""
        return ""

    with pytest.raises(ValueError, match=r"^tool name get-weather is defined twice$"):
        toolbox.tool(name="get-weather")(second)
    with pytest.raises(
        ValueError,
        match=r"^tool names get-weather and get_weather clash: both are tools\.get_weather in JavaScript$",
    ):
        toolbox.tool(name="get_weather")(second)
    with pytest.raises(ValueError, match=r"^tool name exec is reserved for the model's own tool$"):
        toolbox.tool(name="exec")(second)
    with pytest.raises(ValueError, match=r"^tool names must not be empty, got ''$"):
        toolbox.tool(name="")(second)
    assert [d.name for d in toolbox.definitions()] == ["get-weather"]


# ---- cells calling typed tools ---------------------------------------------------------------


def weather_toolbox(**options: Any) -> Toolbox:
    toolbox = Toolbox(**options)

    @toolbox.tool
    async def forecast(
        city: str,
        days: Annotated[int, msgspec.Meta(ge=1)] = 1,
        unit: Unit = Unit.CELSIUS,
        place: Place | None = None,
    ) -> list[Reading]:
        """Forecast for a city."""
        await trio.lowlevel.checkpoint()
        return [Reading(city=city, degrees=10.5 + day, unit=unit) for day in range(days)]

    @toolbox.tool
    def thread_name() -> str:
        """The thread a plain tool runs in."""
        return threading.current_thread().name

    @toolbox.tool
    def fail(kind: Literal["tool-error", "crash", "bare", "unencodable"]) -> Any:
        """Fail in various ways."""
        if kind == "tool-error":
            raise ToolError("no such city: Atlantis")
        if kind == "crash":
            raise RuntimeError("kaput")
        if kind == "bare":
            raise ValueError
        return object()

    return toolbox


CATCH_ALL = """
for (const attempt of attempts) {
  try { text(await attempt()); } catch (e) { text(`${typeof e}: ${e}`); }
}
"""


async def test_results_are_converted_to_json(session: Session) -> None:
    toolbox = weather_toolbox()
    source = """
        text(await tools.forecast({ city: "Oslo", days: 2, unit: "fahrenheit" }));
        text(await tools.forecast({ city: "Lima", place: { lat: -12, lon: -77.5 } }));
        text((await tools.thread_name()) === "MainThread");
    """
    with trio.fail_after(10):
        response = await run(session, toolbox, source, tools=toolbox.definitions())
    assert response == Completed(cell_id="1", content_items=response.content_items)
    assert texts(response) == [
        '[{"city":"Oslo","degrees":10.5,"unit":"fahrenheit"},{"city":"Oslo","degrees":11.5,"unit":"fahrenheit"}]',
        '[{"city":"Lima","degrees":10.5,"unit":"celsius"}]',
        "false",
    ]


async def test_invalid_arguments_reach_the_catch_naming_the_field(session: Session) -> None:
    toolbox = weather_toolbox()
    source = """
        const attempts = [
          () => tools.forecast({ city: 3 }),
          () => tools.forecast({}),
          () => tools.forecast(),
          () => tools.forecast({ city: "Oslo", hours: 2 }),
          () => tools.forecast({ city: "Oslo", place: { lat: "north", lon: 10 } }),
          () => tools.forecast({ city: "Oslo", unit: "kelvin" }),
          () => tools.forecast({ city: "Oslo", days: 0 }),
          () => tools.forecast({ city: "Oslo", days: 1.5 }),
          () => tools.forecast("Oslo"),
        ];
    """
    with trio.fail_after(10):
        response = await run(session, toolbox, source + CATCH_ALL, tools=toolbox.definitions())
    prefix = "string: invalid arguments for tool forecast: "
    assert texts(response) == [
        prefix + "Expected `str`, got `int` - at `$.city`",
        prefix + "Object missing required field `city`",
        prefix + "Object missing required field `city`",
        prefix + "Object contains unknown field `hours`",
        prefix + "Expected `float`, got `str` - at `$.place.lat`",
        prefix + "Invalid enum value 'kelvin' - at `$.unit`",
        prefix + "Expected `int` >= 1 - at `$.days`",
        prefix + "Expected `int`, got `float` - at `$.days`",
        prefix + "Expected `object`, got `str`",
    ]


async def test_tool_errors_pass_and_failures_are_logged(
    session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    toolbox = weather_toolbox()
    source = """
        const attempts = ["tool-error", "crash", "bare", "unencodable"].map(
          (kind) => () => tools.fail({ kind }),
        );
    """
    with caplog.at_level(logging.ERROR, logger="codemode.toolbox"), trio.fail_after(10):
        response = await run(session, toolbox, source + CATCH_ALL, tools=toolbox.definitions())
    assert texts(response) == [
        "string: no such city: Atlantis",
        "string: tool fail failed: kaput",
        "string: tool fail failed: ValueError",
        "string: tool fail failed: Encoding objects of type object is unsupported",
    ]
    failures = [r for r in caplog.records if r.name == "codemode.toolbox"]
    assert [r.getMessage() for r in failures] == ["tool fail failed (cell 1)"] * 3
    assert [type(r.exc_info[1]) for r in failures if r.exc_info] == [
        RuntimeError,
        ValueError,
        TypeError,
    ]


class RecordingSource(RecordingDelegate):
    """A tool source with no tools that records closed cells and notifications."""

    def definitions(self) -> list[ToolDefinition]:
        return []


class ReturnWatch:
    """A delegate around another that records when its `invoke_tool` calls return."""

    def __init__(self, inner: codemode.SessionDelegate) -> None:
        self.inner = inner
        self.returned = trio.Event()

    async def invoke_tool(self, call: NestedToolCall) -> Any:
        try:
            return await self.inner.invoke_tool(call)
        finally:
            self.returned.set()

    async def notify(self, call_id: str, cell_id: str, text: str) -> None:
        await self.inner.notify(call_id, cell_id, text)

    def cell_closed(self, cell_id: str) -> None:
        self.inner.cell_closed(cell_id)


async def test_cancelled_sync_tool_is_abandoned(session: Session) -> None:
    entered = trio.Event()
    release = threading.Event()
    finished: list[str] = []
    toolbox = Toolbox()

    @toolbox.tool
    def block() -> str:
        """Blocks its thread until released."""
        trio.from_thread.run_sync(entered.set)
        release.wait(30)
        finished.append("late result")
        return "late result"

    recorder = RecordingSource()
    combined = combine(toolbox, recorder)
    watch = ReturnWatch(combined)
    source = 'text("before"); text(await tools.block());'
    try:
        with trio.fail_after(10):
            started = await execute(
                session, watch, source, tools=combined.definitions(), observe_initial=False
            )
            await entered.wait()
            outcome = await session.terminate(started.cell_id)
            await watch.returned.wait()
            await recorder.until(lambda: recorder.closed == [started.cell_id])
        assert outcome == LiveCell(
            response=Terminated(
                cell_id=started.cell_id, content_items=outcome.response.content_items
            )
        )
        assert texts(outcome) == ["before"]
        assert finished == []  # the call returned while its thread still blocks
    finally:
        release.set()


# ---- notifications ---------------------------------------------------------------------------

NOTIFYING = 'notify("first"); notify({ step: 2 }); text("done");'


async def test_sync_on_notify_receives_cell_and_text(session: Session) -> None:
    received: list[tuple[str, str]] = []
    toolbox = Toolbox(on_notify=lambda cell_id, text: received.append((cell_id, text)))
    with trio.fail_after(10):
        await run(session, toolbox, NOTIFYING)
    # Each notification is a task of its own: their order is not kept.
    assert sorted(received) == [("1", "first"), ("1", '{"step":2}')]


async def test_async_on_notify_is_awaited(session: Session) -> None:
    received: list[tuple[str, str]] = []

    async def on_notify(cell_id: str, text: str) -> None:
        await trio.lowlevel.checkpoint()
        received.append((cell_id, text))

    toolbox = Toolbox(on_notify=on_notify)
    with trio.fail_after(10):
        await run(session, toolbox, NOTIFYING)
    assert sorted(received) == [("1", "first"), ("1", '{"step":2}')]


async def test_notifications_are_logged_by_default(
    session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="codemode.toolbox"), trio.fail_after(10):
        await run(session, Toolbox(), NOTIFYING)
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "codemode.toolbox"]
    assert sorted(logged) == [
        (logging.INFO, "notification from cell 1: first"),
        (logging.INFO, 'notification from cell 1: {"step":2}'),
    ]


# ---- combine -----------------------------------------------------------------------------------


def named_toolbox(*names: str, received: list[str] | None = None) -> Toolbox:
    def on_notify(cell_id: str, text: str) -> None:
        if received is not None:
            received.append(f"{names[0]}: {text}")

    toolbox = Toolbox(on_notify=on_notify)
    for name in names:

        def answer(question: str, _name: str = name) -> str:
            """Answer a question."""
            return f"{_name} answers {question}"

        toolbox.tool(name=name)(answer)
    return toolbox


async def test_combine_routes_calls_and_fans_out(session: Session) -> None:
    received: list[str] = []
    first = named_toolbox("alpha", "beta", received=received)
    second = named_toolbox("gamma", received=received)
    recorder = RecordingSource()
    delegate = combine(first, second, recorder)
    assert [d.name for d in delegate.definitions()] == ["alpha", "beta", "gamma"]
    source = """
        text(await tools.gamma({ question: "q1" }));
        text(await tools.alpha({ question: "q2" }));
        notify("hello");
    """
    with trio.fail_after(10):
        response = await run(session, delegate, source, tools=delegate.definitions())
        await recorder.until(lambda: recorder.closed == ["1"])
    assert texts(response) == ["gamma answers q1", "alpha answers q2"]
    assert sorted(received) == ["alpha: hello", "gamma: hello"]
    assert recorder.notifications == [("call-1", "1", "hello")]


async def test_combine_rejects_a_tool_it_does_not_hold() -> None:
    delegate = combine(named_toolbox("alpha"))
    call = NestedToolCall(
        cell_id="1",
        runtime_tool_call_id="tool-1",
        tool_name=ToolName.plain("omega"),
        tool_kind=codemode.ToolKind.FUNCTION,
        input={},
    )
    with pytest.raises(ToolError, match=r"^tool omega is not in these toolboxes$"):
        await delegate.invoke_tool(call)
    with pytest.raises(ToolError, match=r"^tool omega is not in this toolbox$"):
        await named_toolbox("alpha").invoke_tool(call)


def test_combine_rejects_duplicate_names() -> None:
    with pytest.raises(ValueError, match=r"^tool name beta is defined twice$"):
        combine(named_toolbox("alpha", "beta"), named_toolbox("beta"))
    with pytest.raises(ValueError, match=r"^tool names get-x and get_x clash"):
        combine(named_toolbox("get-x"), named_toolbox("get_x"))
    assert combine().definitions() == []
    nested = combine(combine(named_toolbox("alpha")), named_toolbox("beta"))
    assert [d.name for d in nested.definitions()] == ["alpha", "beta"]
