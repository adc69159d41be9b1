/*
 * prelude.js: the functions a cell sees as its globals (design.md, runtime 3). Their work is
 * done natively by the binding (`_quickjs.c`, "The cell's globals"); these are only their
 * faces. They are JavaScript rather than native functions because the sandbox surface pins what
 * a cell can see of them (tests/sandbox_surface.json): plain functions with a `prototype`, a
 * source that reads as native code (the binding drops the source text) and the file name
 * `<prelude>`. The image helpers are in prelude_images.js, which the binding reads only for a
 * cell that calls one.
 *
 * The binding compiles this script once per engine and reads it into each runtime it
 * prepares, ahead of any cell (engine rule 9). The script yields a function that the binding
 * calls with its native hook and its `outputText`, and that returns the faces, in the order of
 * the binding's `enum shell`; the binding makes them globals when the cell starts. Each face
 * passes its arguments to the hook with the number of what it does (the binding's
 * `enum hook`).
 *
 * Rules:
 * 1. The hook lives in this closure: cell code can neither reach nor replace it. The faces use
 *    no global and no builtin: they only call the hook.
 * 2. `text` converts its value with `outputText`, a native function of that name: a `toJSON`
 *    that `text` calls sees it among its stack frames, as it saw the JavaScript helper.
 */
(function prepareCellGlobals(native, outputText) {
  "use strict";

  return [
    function text(value) {
      native(0, outputText(value));
    },
    // The helper is told how many arguments the cell gave (an explicit `undefined` detail).
    function image(imageUrlOrItem, detail) {
      native(1, arguments.length, imageUrlOrItem, detail);
    },
    function generatedImage(result) {
      native(2, result);
    },
    function notify(value) {
      native(3, value);
    },
    function yield_control() {
      native(4);
    },
    function exit() {
      native(5);
    },
    function setTimeout(callback, delayMs) {
      return native(6, callback, delayMs);
    },
    function clearTimeout(id) {
      return native(7, id);
    },
    function store(key, value) {
      native(8, key, value);
    },
    function load(key) {
      return native(9, key);
    },
    // The binding calls this once per tool of the cell: the function `tools.<name>`.
    function nestedTool(index) {
      return function () {
        return native(10, index, arguments);
      };
    },
    // QuickJS-ng's V8-style `Error.prepareStackTrace` hands cell code CallSite objects whose
    // `getFunction()` returns the function of every frame, strict or not: from a timer
    // callback the binding's own functions, from a `toJSON` the faces above
    // (tests/test_sandbox_surface.py). V8 returns undefined for strict-mode frames, and every
    // frame of a cell is strict (module code) or ours, so the binding puts this in its place.
    { getFunction() { return undefined; } }.getFunction,
  ];
});
