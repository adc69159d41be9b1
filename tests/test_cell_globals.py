"""The global API of a cell, rule by rule (design.md, runtime 3), with its exact texts."""

from __future__ import annotations

import msgspec
import pytest
from codemode_host.engine import (
    CellTool,
    Engine,
    Finished,
    ImageOutput,
    Outcome,
    TimerCleared,
    TimerStarted,
    ToolCallRequested,
    YieldRequested,
)

from tests.helpers import ToolRejectedError, ended, run_cell, without_heap

GENERIC_IMAGE_ERROR = (
    "image expects a non-empty image URL string, an object with image_url and optional detail,"
    " or a raw MCP image block"
)
REMOTE_IMAGE_ERROR = (
    "Tool call failed: remote image URLs are not supported in tool outputs."
    " Pass a base64 data URI instead"
)
PNG = "data:image/png;base64,AAAA"

# ---- 3.2 the global object ---------------------------------------------------------------

ALLOWED_GLOBALS = {
    "AggregateError", "ALL_TOOLS", "Array", "ArrayBuffer", "AsyncDisposableStack", "BigInt",
    "BigInt64Array", "BigUint64Array", "Boolean", "clearTimeout", "DataView", "Date",
    "DisposableStack", "Error", "EvalError", "FinalizationRegistry", "Float16Array",
    "Float32Array", "Float64Array", "Function", "Infinity", "Int16Array", "Int32Array",
    "Int8Array", "Intl", "Iterator", "JSON", "Map", "Math", "NaN", "Number", "Object", "Promise",
    "Proxy", "RangeError", "ReferenceError", "Reflect", "RegExp", "Set", "String",
    "SuppressedError", "Symbol", "SyntaxError", "Temporal", "TypeError", "URIError",
    "Uint16Array", "Uint32Array", "Uint8Array", "Uint8ClampedArray", "WeakMap", "WeakRef",
    "WeakSet", "__codexContentItems", "add_content", "decodeURI", "decodeURIComponent",
    "encodeURI", "encodeURIComponent", "escape", "exit", "eval", "generatedImage", "globalThis",
    "image", "isFinite", "isNaN", "load", "notify", "parseFloat", "parseInt", "setTimeout",
    "store", "text", "tools", "undefined", "unescape", "yield_control",
}  # fmt: skip
ADDED_GLOBALS = {
    "tools", "ALL_TOOLS", "clearTimeout", "setTimeout", "text", "image", "generatedImage",
    "store", "load", "notify", "yield_control", "exit",
}  # fmt: skip


async def test_global_object_holds_only_allowed_names(engine: Engine) -> None:
    run = await run_cell(engine, "text(JSON.stringify(Object.getOwnPropertyNames(globalThis)))")
    names = set(msgspec.json.decode(run.texts[0]))
    assert names <= ALLOWED_GLOBALS, names - ALLOWED_GLOBALS
    assert names >= ADDED_GLOBALS


@pytest.mark.parametrize(
    "name",
    ["console", "print", "std", "os", "scriptArgs", "navigator", "performance", "queueMicrotask",
     "Atomics", "SharedArrayBuffer", "WebAssembly", "InternalError", "atob", "btoa",
     "DOMException"],
)  # fmt: skip
async def test_engine_extras_are_absent(engine: Engine, name: str) -> None:
    run = await run_cell(engine, f'text(Object.hasOwn(globalThis, "{name}")); text(typeof {name})')
    assert run.texts == ["false", "undefined"]


async def test_console_log_is_a_reference_error(engine: Engine) -> None:
    run = await run_cell(engine, 'console.log("x")')
    assert run.error is not None
    assert run.error.startswith("ReferenceError: console is not defined")


async def test_added_globals_are_plain_writable_properties(engine: Engine) -> None:
    run = await run_cell(
        engine,
        """
        const d = Object.getOwnPropertyDescriptor(globalThis, "text");
        text(d.writable && d.configurable && typeof d.value === "function");
        globalThis.text = () => {};
        """,
    )
    assert run.texts == ["true"]


async def test_prelude_internals_are_unreachable(engine: Engine) -> None:
    run = await run_cell(
        engine,
        """
        JSON.stringify = () => { throw new Error("patched"); };
        JSON.parse = () => { throw new Error("patched"); };
        String.prototype.trim = () => "";
        Array.prototype.includes = () => false;
        store("k", { a: [1] });
        text({ a: 1 });
        notify("still works");
        image("data:image/png;base64,AA", "LOW");
        text(load("k").a[0]);
        const names = Object.getOwnPropertyNames(globalThis);
        text(names.some((n) => /native|hook|dispatch|pending/i.test(n)));
        """,
    )
    assert run.error is None, run.error
    assert run.texts == ['{"a":1}', "1", "false"]
    assert run.notifications == ["still works"]
    assert run.images == [ImageOutput("data:image/png;base64,AA", "low")]


async def test_intl_is_absent(engine: Engine) -> None:
    run = await run_cell(engine, "text(typeof Intl)")
    assert run.texts == ["undefined"]


# ---- 3.3 / 3.4 text ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("undefined", "undefined"),
        ("", "undefined"),
        ("null", "null"),
        ("true", "true"),
        ("false", "false"),
        ("1.5", "1.5"),
        ("NaN", "NaN"),
        ("1e21", "1e+21"),
        ("-0", "0"),
        ("10n", "10"),
        ('""', ""),
        ('"plain"', "plain"),
        ("{ json: true }", '{"json":true}'),
        ("[1, 'a', null]", '[1,"a",null]'),
        ("new Date(0)", '"1970-01-01T00:00:00.000Z"'),
        ("{ toJSON() { return undefined; }, toString() { return 'fallback'; } }", "fallback"),
        ("Symbol('s')", "Symbol(s)"),
        ("new Map([[1, 2]])", "{}"),
        ("function named() {}", "function named() {}"),
    ],
)
async def test_text_conversions(engine: Engine, expression: str, expected: str) -> None:
    run = await run_cell(engine, f"text({expression})")
    assert run.error is None
    assert run.texts == [expected]


async def test_text_uses_only_its_first_argument_and_returns_undefined(engine: Engine) -> None:
    run = await run_cell(engine, 'const r = text("a", "b"); text(r === undefined)')
    assert run.texts == ["a", "true"]


async def test_text_of_a_long_concatenation_is_the_string_itself(engine: Engine) -> None:
    # QuickJS-ng keeps a long concatenation as a rope, a string all the same.
    run = await run_cell(engine, 'const s = "x".repeat(5000); text(s + "1"); notify(s + "2")')
    assert run.texts == ["x" * 5000 + "1"]
    assert run.notifications == ["x" * 5000 + "2"]


async def test_text_of_a_circular_value_fails_with_v8_wording(engine: Engine) -> None:
    run = await run_cell(engine, "const a = {}; a.self = a; text(a)")
    assert run.finished.outcome is Outcome.ERROR
    assert run.error is not None
    assert run.error.startswith("TypeError: Converting circular structure to JSON")


async def test_helper_errors_are_plain_strings(engine: Engine) -> None:
    run = await run_cell(
        engine,
        """
        try { text({ b: 1n }); } catch (e) { text(typeof e); text(e.message === undefined); text(e.split("\\n")[0]); }
        try { notify(" "); } catch (e) { text(typeof e); text(e); }
        """,
    )
    assert run.texts == [
        "string", "true", "TypeError: BigInt are forbidden in JSON.stringify",
        "string", "notify expects non-empty text",
    ]  # fmt: skip


async def test_uncaught_helper_error_is_the_exact_string(engine: Engine) -> None:
    run = await run_cell(engine, 'text("kept"); notify("")')
    assert run.texts == ["kept"]
    assert ended(run) == Finished(Outcome.ERROR, "notify expects non-empty text")


# ---- 3.5 / 3.6 images --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (f'image("{PNG}")', ImageOutput(PNG, "high")),
        (f'image("{PNG}", "low")', ImageOutput(PNG, "low")),
        (f'image("{PNG}", "ORIGINAL")', ImageOutput(PNG, "original")),
        (f'image("{PNG}", null)', ImageOutput(PNG, "high")),
        (f'image({{ image_url: "{PNG}", detail: "auto" }})', ImageOutput(PNG, "auto")),
        (f'image({{ image_url: "{PNG}", detail: null }})', ImageOutput(PNG, "high")),
        (
            f'image({{ image_url: "{PNG}", detail: "high" }}, "original")',
            ImageOutput(PNG, "original"),
        ),
        (
            'image({ type: "image", data: "AAAA", mimeType: "image/png", _meta: { "codex/imageDetail": "original" } })',
            ImageOutput("data:image/png;base64,AAAA", "original"),
        ),
        (
            'image({ type: "image", data: "AAAA", mimeType: "image/png", _meta: { "codex/imageDetail": "original" } }, "high")',
            ImageOutput("data:image/png;base64,AAAA", "high"),
        ),
        (
            'image({ type: "image", data: "AAAA", _meta: { "codex/imageDetail": "huge" } })',
            ImageOutput("data:application/octet-stream;base64,AAAA", "high"),
        ),
        (
            'image({ type: "image", data: "AAAA", mime_type: "image/jpeg" })',
            ImageOutput("data:image/jpeg;base64,AAAA", "high"),
        ),
        (
            f'image({{ type: "image", data: "DATA:{PNG[5:]}" }})',
            ImageOutput(f"DATA:{PNG[5:]}", "high"),
        ),
    ],
)
async def test_image_items(engine: Engine, call: str, expected: ImageOutput) -> None:
    run = await run_cell(engine, f"const r = {call}; text(r === undefined)")
    assert run.error is None, run.error
    assert run.images == [expected]
    assert run.texts == ["true"]


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ('image("")', GENERIC_IMAGE_ERROR),
        ("image()", GENERIC_IMAGE_ERROR),
        ("image(null)", GENERIC_IMAGE_ERROR),
        ("image(42)", GENERIC_IMAGE_ERROR),
        (f'image(["{PNG}"])', GENERIC_IMAGE_ERROR),
        ("image({ image_url: 42 })", GENERIC_IMAGE_ERROR),
        (
            'image({ content: [{ type: "image", data: "AA" }], isError: false })',
            GENERIC_IMAGE_ERROR,
        ),
        ('image({ type: "text", text: "hi" })', 'image only accepts MCP image blocks, got "text"'),
        ('image({ type: "image" })', "image expected MCP image data"),
        ('image({ type: "image", data: "" })', "image expected MCP image data"),
        ('image("http://example.com/a.png")', REMOTE_IMAGE_ERROR),
        ('image("HTTPS://example.com/a.png")', REMOTE_IMAGE_ERROR),
        ('image({ image_url: "https://example.com/a.png" })', REMOTE_IMAGE_ERROR),
        (f'image("{PNG}", "medium")', "image detail must be one of: auto, low, high, original"),
        (f'image("{PNG}", 3)', "image detail must be a string when provided"),
        (
            f'image({{ image_url: "{PNG}", detail: 3 }})',
            "image detail must be a string when provided",
        ),
        ("generatedImage(null)", "generatedImage expects an image generation result object"),
        (f'generatedImage("{PNG}")', "generatedImage expects an image generation result object"),
        (
            f'generatedImage({{ image_url: "{PNG}", output_hint: 1 }})',
            "generatedImage output_hint must be a string when provided",
        ),
        ('generatedImage({ image_url: "http://example.com/a.png" })', REMOTE_IMAGE_ERROR),
        ("generatedImage({})", GENERIC_IMAGE_ERROR),
    ],
)
async def test_image_errors(engine: Engine, call: str, expected: str) -> None:
    run = await run_cell(engine, call)
    assert ended(run) == Finished(Outcome.ERROR, expected)
    assert run.images == []


async def test_image_helpers_read_after_patched_builtins_use_the_originals(engine: Engine) -> None:
    # The engine reads the image helpers at a cell's first image call, after its code ran.
    run = await run_cell(
        engine,
        """
        const broken = () => { throw new Error("patched"); };
        JSON.stringify = broken;
        JSON.parse = broken;
        Array.isArray = broken;
        Array.prototype[Symbol.iterator] = broken;
        Object.create = broken;
        String.prototype.toLowerCase = broken;
        String.prototype.slice = broken;
        Object.defineProperty(Object.prototype, "image", { set: broken, get: broken });
        image({ type: "image", data: "AAAA", mimeType: "image/png" }, "LOW");
        generatedImage({ image_url: "data:image/gif;base64,R0", output_hint: "hint" });
        try { image({ type: "audio" }); } catch (e) { text(e); }
        """,
    )
    assert run.error is None, run.error
    assert run.images == [
        ImageOutput("data:image/png;base64,AAAA", "low"),
        ImageOutput("data:image/gif;base64,R0", "high"),
    ]
    assert run.texts == ["hint", 'image only accepts MCP image blocks, got "audio"']


async def test_generated_image_appends_image_then_hint(engine: Engine) -> None:
    run = await run_cell(engine, f'generatedImage({{ image_url: "{PNG}", output_hint: "a cat" }})')
    assert run.images == [ImageOutput(PNG, "high")]
    assert run.texts == ["a cat"]


# ---- 3.7 notify --------------------------------------------------------------------------


async def test_notify_is_out_of_band_and_converts_like_text(engine: Engine) -> None:
    run = await run_cell(engine, "const r = notify({ n: 1 }); notify(5); text(r === undefined)")
    assert run.notifications == ['{"n":1}', "5"]
    assert run.texts == ["true"]


# ---- 3.8 store / load --------------------------------------------------------------------


async def test_store_and_load_round_trip_fresh_copies(engine: Engine) -> None:
    run = await run_cell(
        engine,
        """
        store("doc", { title: "Notebook", items: [1, true, null] });
        const a = load("doc"); a.items.push(4);
        text(load("doc")); text(a === load("doc")); text(load("missing"));
        store(7, [NaN, undefined, () => 1]);
        text(load("7"));
        """,
    )
    assert run.error is None
    assert run.texts == [
        '{"title":"Notebook","items":[1,true,null]}', "false", "undefined", "[null,null,null]",
    ]  # fmt: skip
    assert [(s.key, s.value_json) for s in run.stores] == [
        ("doc", b'{"title":"Notebook","items":[1,true,null]}'),
        ("7", b"[null,null,null]"),
    ]


async def test_load_sees_the_values_stored_before_the_cell_started(engine: Engine) -> None:
    run = await run_cell(
        engine,
        'text(load("a").x); store("a", 2); text(load("a")); text(load("b"))',
        stored_values={"a": b'{"x":1}', "b": b'"bee"'},
    )
    assert run.texts == ["1", "2", "bee"]


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (
            'store("k", undefined)',
            'Unable to store "k". Only plain serializable objects can be stored.',
        ),
        ('store("k")', 'Unable to store "k". Only plain serializable objects can be stored.'),
        (
            'store("k", () => 1)',
            'Unable to store "k". Only plain serializable objects can be stored.',
        ),
        (
            'store("a\\"b\\n", Symbol())',
            'Unable to store "a\\"b\\n". Only plain serializable objects can be stored.',
        ),
        ("store(Symbol(), 1)", "store key must be a string"),
        ("load(Symbol())", "load key must be a string"),
    ],
)
async def test_store_errors(engine: Engine, call: str, expected: str) -> None:
    run = await run_cell(engine, call)
    assert ended(run) == Finished(Outcome.ERROR, expected)
    assert run.stores == []


async def test_store_of_a_circular_value_rethrows_the_error_text(engine: Engine) -> None:
    run = await run_cell(engine, "const a = []; a.push(a); store('k', a)")
    assert run.error is not None
    assert run.error.startswith("TypeError: Converting circular structure to JSON")


# ---- 3.9 / 3.10 yield_control and exit ---------------------------------------------------


async def test_yield_control_publishes_a_request_and_continues(engine: Engine) -> None:
    run = await run_cell(engine, 'text("before"); const r = yield_control(); text(r === undefined)')
    assert [type(e).__name__ for e in run.events[1:]] == [
        "TextOutput", "YieldRequested", "TextOutput", "Finished",
    ]  # fmt: skip
    assert YieldRequested() in run.events
    assert run.texts == ["before", "true"]


async def test_exit_ends_the_cell_successfully(engine: Engine) -> None:
    run = await run_cell(engine, 'text("before"); exit(); text("after")')
    assert ended(run) == Finished(Outcome.OK, None)
    assert run.texts == ["before"]


async def test_exit_inside_a_function_after_await(engine: Engine) -> None:
    run = await run_cell(
        engine, 'async function f() { await null; exit(); } await f(); text("after")'
    )
    assert ended(run) == Finished(Outcome.OK, None)
    assert run.texts == []


async def test_exit_can_be_caught_like_upstream(engine: Engine) -> None:
    run = await run_cell(engine, 'try { exit(); } catch (e) { text(e); } text("after")')
    assert run.texts == ["__codex_code_mode_exit__", "after"]
    assert run.error is None


async def test_exit_in_a_timer_callback_fails_with_the_sentinel(engine: Engine) -> None:
    run = await run_cell(engine, "setTimeout(() => exit(), 0); await new Promise(() => {})")
    assert ended(run) == Finished(Outcome.ERROR, "__codex_code_mode_exit__")


async def test_a_plain_sentinel_throw_is_a_failure(engine: Engine) -> None:
    run = await run_cell(engine, 'throw "__codex_code_mode_exit__"')
    assert ended(run) == Finished(Outcome.ERROR, "__codex_code_mode_exit__")


# ---- 3.11 timers -------------------------------------------------------------------------


async def test_set_timeout_ids_delays_and_callback_form(engine: Engine) -> None:
    run = await run_cell(
        engine,
        """
        const ids = [
          setTimeout(() => {}, -5), setTimeout(() => {}, NaN), setTimeout(() => {}, "25"),
          setTimeout(() => {}, 1.9), setTimeout(() => {}),
        ];
        text(ids);
        await new Promise((resolve) => setTimeout(function (...args) {
          text(args.length); text(this === undefined); resolve();
        }, 1, "extra"));
        """,
    )
    assert run.error is None
    assert run.texts == ["[1,2,3,4,5]", "0", "true"]
    delays = [e.delay_ms for e in run.events if isinstance(e, TimerStarted)]
    assert delays == [0, 0, 25, 1, 0, 1]


async def test_set_timeout_requires_a_function(engine: Engine) -> None:
    run = await run_cell(engine, 'setTimeout("code", 1)')
    assert ended(run) == Finished(Outcome.ERROR, "setTimeout expects a function callback")


async def test_clear_timeout(engine: Engine) -> None:
    run = await run_cell(
        engine,
        """
        const id = setTimeout(() => text("cleared timer ran"), 0);
        clearTimeout(id);
        for (const v of [undefined, null, "abc", -1, 0, Infinity, 999]) clearTimeout(v);
        text(clearTimeout() === undefined);
        await new Promise((r) => setTimeout(r, 5));
        text("done");
        """,
    )
    assert run.texts == ["true", "done"]
    assert TimerCleared(1) in run.events
    assert [e for e in run.events if isinstance(e, TimerCleared)] == [TimerCleared(1)]


async def test_clear_timeout_with_a_symbol(engine: Engine) -> None:
    run = await run_cell(engine, "clearTimeout(Symbol())")
    assert ended(run) == Finished(Outcome.ERROR, "clearTimeout expects a numeric timeout id")


async def test_a_throwing_timer_callback_fails_the_cell(engine: Engine) -> None:
    run = await run_cell(
        engine,
        'setTimeout(() => { throw new Error("tick"); }, 0); await new Promise(() => {})',
    )
    assert run.error is not None
    assert run.error.startswith("Error: tick\n    at ")


async def test_timers_do_not_keep_the_cell_alive(engine: Engine) -> None:
    run = await run_cell(engine, 'setTimeout(() => text("late"), 0); text("done")')
    assert ended(run) == Finished(Outcome.OK, None)
    assert run.texts == ["done"]


# ---- 3.12 tools --------------------------------------------------------------------------

TOOLS = [CellTool("search", "Search things."), CellTool("apply_patch", "Patch files.")]


async def test_tools_and_all_tools(engine: Engine) -> None:
    run = await run_cell(
        engine,
        "text(Object.keys(tools)); text(ALL_TOOLS); text(typeof tools.missing)",
        tools=TOOLS,
    )
    assert run.texts == [
        '["search","apply_patch"]',
        '[{"name":"search","description":"Search things."},'
        '{"name":"apply_patch","description":"Patch files."}]',
        "undefined",
    ]


async def test_calling_a_tool_that_is_not_enabled_is_a_type_error(engine: Engine) -> None:
    run = await run_cell(engine, "await tools.hidden({})", tools=TOOLS)
    assert run.error is not None
    assert run.error.startswith("TypeError: not a function")  # the runtime names the callee


async def test_tool_call_inputs(engine: Engine) -> None:
    run = await run_cell(
        engine,
        """
        await tools.search();
        await tools.search(undefined);
        await tools.search(() => 1);
        await tools.search({ q: "x", skip: undefined }, "ignored");
        await tools.apply_patch("*** Begin Patch");
        """,
        tools=TOOLS,
    )
    assert run.error is None
    assert run.tool_calls == [
        ToolCallRequested(1, 0, None),
        ToolCallRequested(2, 0, None),
        ToolCallRequested(3, 0, None),
        ToolCallRequested(4, 0, b'{"q":"x"}'),
        ToolCallRequested(5, 1, b'"*** Begin Patch"'),
    ]


async def test_unserialisable_tool_input_throws_synchronously(engine: Engine) -> None:
    run = await run_cell(
        engine,
        "let p; try { p = tools.search({ n: 1n }); } catch (e) { text(typeof e); text(p === undefined); }",
        tools=TOOLS,
    )
    assert run.texts == ["string", "true"]
    assert run.tool_calls == []


async def test_tool_results_and_rejections(engine: Engine) -> None:
    async def answer(call: ToolCallRequested) -> object:
        if call.call_id == 2:
            raise ToolRejectedError("tool failed")
        return {"n": call.call_id}

    run = await run_cell(
        engine,
        """
        const first = await tools.search({});
        text(first.n);
        try { await tools.search({}); } catch (e) { text(typeof e); text(e); }
        """,
        tools=TOOLS,
        on_tool=answer,
    )
    assert run.texts == ["1", "string", "tool failed"]


async def test_parallel_tool_calls_are_all_requested_before_any_answer(engine: Engine) -> None:
    answered = 0

    async def count(call: ToolCallRequested) -> object:
        nonlocal answered
        answered += 1
        return call.call_id

    run = await run_cell(
        engine,
        "const r = await Promise.all([tools.search(), tools.search(), tools.search()]); text(r)",
        tools=TOOLS,
        on_tool=count,
    )
    assert [c.call_id for c in run.tool_calls] == [1, 2, 3]
    assert run.texts == ["[1,2,3]"]


async def test_unknown_tool_call_id_fails_the_cell(engine: Engine) -> None:
    with engine.start_cell("await tools.search()", tools=TOOLS) as cell:
        events = await cell.next_events()
        while not any(isinstance(e, ToolCallRequested) for e in events):
            events = await cell.next_events()
        cell.settle_tool_call(99, b"null")
        while not any(isinstance(e, Finished) for e in events):
            events = await cell.next_events()
    assert without_heap(events[-1]) == Finished(Outcome.ERROR, "unknown tool call `tool-99`")
