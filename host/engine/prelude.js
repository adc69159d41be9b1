/*
 * prelude.js: the global API of a cell (design.md, runtime 3), run as trusted code in
 * every fresh context before the cell's own source.
 *
 * The binding evaluates this script in two steps. The script yields the preparer below, which
 * the binding calls with the native hooks (a null-prototype object of C functions) when it
 * prepares a runtime, ahead of any cell (engine rule 9): it defines the helpers and returns the
 * configurer. (The binding has already removed every global the reference does not allow,
 * section 3.2; the helpers are all this script adds.) When a cell starts, the binding calls the
 * configurer with the cell's configuration ({tools: [{name, description}], stored: {key: "<JSON
 * text>"}, store_load: bool, stored_limit: number}): it adds the globals (`store` and `load`
 * only with store_load) and returns the dispatcher through which the binding settles tool calls
 * and fires timers. Nothing cell-specific happens before the configurer runs. The image helpers
 * are in prelude_images.js, which the binding reads only for a cell that calls one.
 *
 * Rules:
 * 1. The hooks and all bookkeeping live in this closure: cell code can neither reach nor
 *    replace them. Builtins the helpers rely on are captured here, before cell code can
 *    patch them.
 * 2. Helper validation errors are thrown as plain strings with the reference's exact texts
 *    (section 3.3).
 * 3. Values leave as JSON text and come back through JSON.parse: every load and every tool
 *    result is a fresh copy. A tool result that is a string comes as its text, parsing nothing
 *    (a string has no identity to share, and a large one was most of a tool call's cost).
 */
(function prepareCellGlobals(native) {
  "use strict";

  const global = globalThis;
  const apply = Reflect.apply;
  const ownNames = Object.getOwnPropertyNames;
  const hasOwn = Object.hasOwn;
  const defineProperty = Reflect.defineProperty;
  const nullObject = () => Object.create(null);
  const stringify = JSON.stringify;
  const parseJson = JSON.parse;
  const toNumber = Number;
  const isFiniteNumber = Number.isFinite;
  // Not Math.trunc: QuickJS-ng builds a builtin namespace on first use, and Math's forty
  // functions were 3 % of every cell's creation. Only ever given a positive finite number.
  const truncate = (number) => number - (number % 1);
  const isArray = Array.isArray;
  const PromiseCtor = Promise;
  const ErrorCtor = Error;
  const TypeErrorCtor = TypeError;
  const trim = String.prototype.trim;
  const trimEnd = String.prototype.trimEnd;
  const toLowerCase = String.prototype.toLowerCase;
  const charCodeAt = String.prototype.charCodeAt;
  const sliceString = String.prototype.slice;
  const toHex = Number.prototype.toString;

  const EXIT_SENTINEL = "__codex_code_mode_exit__";

  // ---- text of values ------------------------------------------------------------------

  function safeString(value) {
    try {
      return `${value}`;
    } catch {
      try {
        return String(value);
      } catch {
        return "[value that cannot be converted to a string]";
      }
    }
  }

  // The text of a thrown value, as the reference builds it (section 3.14). QuickJS stacks hold
  // only the frame lines, so an Error's text is `String(e)` followed by its frames, as in V8.
  function errorText(thrown) {
    if (thrown !== null && (typeof thrown === "object" || typeof thrown === "function")) {
      let stack;
      try {
        stack = thrown.stack;
      } catch {
        stack = undefined;
      }
      if (typeof stack === "string") {
        if (!(thrown instanceof ErrorCtor)) return stack;
        const frames = apply(trimEnd, stack, []);
        const head = safeString(thrown);
        return frames ? `${head}\n${frames}` : head;
      }
    }
    return safeString(thrown);
  }

  // JSON.stringify that throws its failure as a plain string. QuickJS reports a cycle as
  // "circular reference"; the reference's text (and its tests) use V8's wording.
  function jsonText(value) {
    try {
      return stringify(value);
    } catch (error) {
      if (error instanceof TypeErrorCtor && error.message === "circular reference") {
        const frames = typeof error.stack === "string" ? apply(trimEnd, error.stack, []) : "";
        const head = "TypeError: Converting circular structure to JSON";
        throw frames ? `${head}\n${frames}` : head;
      }
      throw errorText(error);
    }
  }

  // Section 3.4: how text() and notify() turn a value into text.
  function outputText(value) {
    switch (typeof value) {
      case "undefined":
        return "undefined";
      case "string":
        return value;
      case "number":
      case "bigint":
        return safeString(value);
      case "boolean":
        return value ? "true" : "false";
    }
    if (value === null) return "null";
    const json = jsonText(value);
    if (typeof json === "string") return json;
    try {
      return String(value);
    } catch (error) {
      throw errorText(error);
    }
  }

  // A key as Rust's `{:?}` prints a string: the reference quotes store keys that way.
  function debugQuote(text) {
    let out = '"';
    for (let i = 0; i < text.length; i++) {
      const ch = text[i];
      const code = apply(charCodeAt, text, [i]);
      if (ch === '"' || ch === "\\") out += `\\${ch}`;
      else if (ch === "\n") out += "\\n";
      else if (ch === "\r") out += "\\r";
      else if (ch === "\t") out += "\\t";
      else if (code === 0) out += "\\0";
      else if (code < 0x20 || code === 0x7f) out += `\\u{${apply(toHex, code, [16])}}`;
      else out += ch;
    }
    return `${out}"`;
  }

  // ---- output helpers ------------------------------------------------------------------

  function text(value) {
    native.text(outputText(value));
  }

  // The image helpers are in prelude_images.js, which the binding reads when a cell first calls
  // one (most never do). It reads no global: it gets the builtins it needs from here, captured
  // before cell code ran (the kit is a literal: `nullObject` would call the cell's Object.create).
  let imageHelpers;

  function images() {
    if (imageHelpers === undefined) {
      const kit = {
        __proto__: null, apply, stringify, parseJson, isArray, toLowerCase, sliceString,
        debugQuote, native,
      };
      imageHelpers = native.loadImages()(kit);
    }
    return imageHelpers;
  }

  function image(imageUrlOrItem, detail) {
    images().image(arguments.length, imageUrlOrItem, detail);
  }

  function generatedImage(result) {
    images().generatedImage(result);
  }

  function notify(value) {
    const message = outputText(value);
    if (apply(trim, message, []) === "") throw "notify expects non-empty text";
    native.notify(message);
  }

  // ---- stored values ---------------------------------------------------------------------

  const storedValues = nullObject();
  // The session's limit on its stored values (0: none), in characters of keys and JSON texts
  // (UTF-16 code units: bytes for ASCII); this cell sees the values as of its start plus its
  // own writes, and that is what it counts. Both are set by the configurer.
  let storedLimit = 0;
  let storedSize = 0;

  function keyText(key, helper) {
    try {
      return `${key}`;
    } catch {
      throw `${helper} key must be a string`;
    }
  }

  function store(key, value) {
    const name = keyText(key, "store");
    const json = jsonText(value);
    if (typeof json !== "string") {
      throw `Unable to store ${debugQuote(name)}. Only plain serializable objects can be stored.`;
    }
    const previous = hasOwn(storedValues, name) ? name.length + storedValues[name].length : 0;
    const size = storedSize - previous + name.length + json.length;
    if (storedLimit && size > storedLimit) {
      throw (
        `Unable to store ${debugQuote(name)}. The session's stored values would exceed their` +
        ` limit of ${storedLimit} bytes.`
      );
    }
    storedValues[name] = json;
    storedSize = size;
    native.store(name, json);
  }

  function load(key) {
    const name = keyText(key, "load");
    if (!hasOwn(storedValues, name)) return undefined;
    try {
      return parseJson(storedValues[name]);
    } catch {
      throw "failed to load stored value";
    }
  }

  // ---- control ---------------------------------------------------------------------------

  function yield_control() {
    native.yieldControl();
  }

  function exit() {
    native.exit();
    throw EXIT_SENTINEL;
  }

  const timers = nullObject();
  let timerCount = 0;
  // Each pending timer is a task on the host: a cell may not hold an unbounded number of them.
  const MAX_PENDING_TIMERS = 10000;
  let pendingTimers = 0;

  function setTimeout(callback, delayMs) {
    if (typeof callback !== "function") throw "setTimeout expects a function callback";
    let delay = toNumber(delayMs);
    delay = !isFiniteNumber(delay) || delay <= 0 ? 0 : truncate(delay);
    if (pendingTimers >= MAX_PENDING_TIMERS) {
      throw `setTimeout: too many pending timers (the limit is ${MAX_PENDING_TIMERS})`;
    }
    const id = ++timerCount;
    timers[id] = callback;
    pendingTimers++;
    native.timerSet(id, delay);
    return id;
  }

  function clearTimeout(id) {
    if (id === undefined || id === null) return undefined;
    let number;
    try {
      number = toNumber(id);
    } catch {
      throw "clearTimeout expects a numeric timeout id";
    }
    if (!isFiniteNumber(number) || number <= 0) return undefined;
    number = truncate(number);
    if (hasOwn(timers, number)) {
      delete timers[number];
      pendingTimers--;
      native.timerClear(number);
    }
    return undefined;
  }

  // ---- nested tools ----------------------------------------------------------------------

  const pendingCalls = nullObject();
  let callCount = 0;

  function nestedTool(index) {
    return function (...args) {
      const input = args.length > 0 ? jsonText(args[0]) : undefined;
      const id = ++callCount;
      return new PromiseCtor((resolve, reject) => {
        pendingCalls[id] = { resolve, reject };
        native.toolCall(id, index, input);
      });
    };
  }

  const tools = {};
  const allTools = [];

  // ---- stack frames ----------------------------------------------------------------------

  // QuickJS-ng's V8-style `Error.prepareStackTrace` hands cell code CallSite objects whose
  // `getFunction()` returns the function of every frame, strict or not: from a timer callback
  // that reached `dispatch` below (and let a cell settle its own tool calls with forged
  // results), from a `toJSON` the helpers' own functions (tests/test_sandbox_surface.py). V8
  // returns undefined for strict-mode frames, and every frame of a cell is strict (module
  // code) or ours, so `getFunction` answers undefined here; the engine's own is dropped.
  {
    const errorCtor = ErrorCtor;
    const previous = errorCtor.prepareStackTrace;
    errorCtor.prepareStackTrace = (_error, sites) => sites;
    const sites = new errorCtor().stack;
    errorCtor.prepareStackTrace = previous;
    Reflect.defineProperty(Object.getPrototypeOf(sites[0]), "getFunction", {
      value: { getFunction() { return undefined; } }.getFunction,
      writable: true,
      enumerable: false,
      configurable: true,
    });
  }

  // ---- the global object -----------------------------------------------------------------

  const added = {
    tools,
    ALL_TOOLS: allTools,
    clearTimeout,
    setTimeout,
    text,
    image,
    generatedImage,
    notify,
    yield_control,
    exit,
  };

  // The binding calls this: (1, id, settle, payload) settles tool call `tool-<id>`: rejects it
  // with an error text (settle 0), resolves it with the value of a JSON text (1) or with a
  // text itself (2, rule 3); (2, id) fires a timer. What it throws fails the cell.
  function dispatch(kind, id, settle, payload) {
    if (kind === 1) {
      const call = pendingCalls[id];
      if (call === undefined) throw `unknown tool call \`tool-${id}\``;
      delete pendingCalls[id];
      if (settle === 1) call.resolve(parseJson(payload));
      else if (settle === 2) call.resolve(payload);
      else call.reject(payload);
    } else if (kind === 2) {
      const callback = timers[id];
      if (callback === undefined) return;
      delete timers[id];
      pendingTimers--;
      apply(callback, undefined, []);
    }
  }

  // The cell's own part, when it starts: its stored values, its tools, and the globals.
  return function configure(config) {
    storedLimit = config.stored_limit;
    for (const key of ownNames(config.stored)) {
      storedValues[key] = config.stored[key];
      storedSize += key.length + storedValues[key].length;
    }
    for (let index = 0; index < config.tools.length; index++) {
      const { name, description } = config.tools[index];
      // Defined, not assigned: `tools.__proto__ = f` would replace the object's prototype (a
      // tool may be called `__proto__`) instead of adding a property. Same descriptor as an
      // assignment's, so the surface is unchanged.
      defineProperty(tools, name, {
        value: nestedTool(index),
        writable: true,
        enumerable: true,
        configurable: true,
      });
      allTools[allTools.length] = { name, description };
    }
    // A session without stored values (reference StoreLoadMode) has no store/load at all.
    if (config.store_load) {
      added.store = store;
      added.load = load;
    }
    for (const name of ownNames(added)) global[name] = added[name];
    return dispatch;
  };
});
