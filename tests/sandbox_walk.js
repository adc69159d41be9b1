// The surface a cell can reach, walked from globalThis and a few roots that only syntax
// reaches (generator and async function prototypes, iterators, a CallSite), through every
// own property (data values, getters and setters, without calling them) and every prototype.
// Prints {surface: {path: own keys, sorted}, functions: [path of every function that is not a
// builtin]}; an object is named by the first path that reached it (breadth first). A builtin's
// source is native code; the prelude's functions read as native code too (the engine drops
// their source text), but keep their file name, `<prelude>` or `<prelude-images>`.
// Used by tests/test_sandbox_surface.py; the walk itself runs before anything is patched.
const ownKeys = Reflect.ownKeys;
const describe = Reflect.getOwnPropertyDescriptor;
const protoOf = Reflect.getPrototypeOf;
const sourceOf = Function.prototype.toString;
const fileOf = Reflect.getOwnPropertyDescriptor(Function.prototype, "fileName").get;
const isBuiltin = (fn) => {
  const file = Reflect.apply(fileOf, fn, []);
  const fromPrelude = typeof file === "string" && file.startsWith("<prelude");
  return Reflect.apply(sourceOf, fn, []).includes("[native code]") && !fromPrelude;
};
const keyName = (key) => (typeof key === "symbol" ? `[${key.description}]` : key);

const savedPrepare = Error.prepareStackTrace;
Error.prepareStackTrace = (_error, sites) => sites;
const callSite = new Error().stack[0];
Error.prepareStackTrace = savedPrepare;

const roots = [
  [globalThis, "globalThis"],
  [function* generator() {}, "(generator function)"],
  [async function asyncFunction() {}, "(async function)"],
  [async function* asyncGenerator() {}, "(async generator function)"],
  [[][Symbol.iterator](), "(array iterator)"],
  [new Map()[Symbol.iterator](), "(map iterator)"],
  [new Set()[Symbol.iterator](), "(set iterator)"],
  [""[Symbol.iterator](), "(string iterator)"],
  ["".matchAll(/x/g), "(regexp string iterator)"],
  [[].values().map((x) => x), "(iterator helper)"],
  [Iterator.from({ next: () => ({ done: true }) }), "(wrapped iterator)"],
  [callSite, "(call site)"],
  [import.meta, "(import.meta)"],
  [(function () { return arguments; })(), "(arguments)"],
];

const seen = new Set();
const surface = {};
const functions = [];
const queue = [...roots];
while (queue.length > 0) {
  const [value, path] = queue.shift();
  if ((typeof value !== "object" && typeof value !== "function") || value === null) continue;
  if (seen.has(value)) continue;
  seen.add(value);
  const keys = ownKeys(value);
  const names = keys.map(keyName).sort();
  // A builtin function holds only its length and name: leave it out of the listing.
  if (!(typeof value === "function" && names.every((n) => n === "length" || n === "name"))) {
    surface[path] = names;
  }
  if (typeof value === "function" && !isBuiltin(value)) {
    functions.push(path);
  }
  for (const key of keys) {
    const descriptor = describe(value, key);
    const at = `${path}.${keyName(key)}`;
    if ("value" in descriptor) queue.push([descriptor.value, at]);
    if (descriptor.get) queue.push([descriptor.get, `${at}<get>`]);
    if (descriptor.set) queue.push([descriptor.set, `${at}<set>`]);
  }
  queue.push([protoOf(value), `${path}<proto>`]);
}
text(JSON.stringify({ surface, functions: functions.sort() }));
