// Functions of every shape whose names the profiler reads from a node
// process's heap (src/runtime/node/tests.rs): each case is called (so
// that it is compiled, its SharedFunctionInfo holding a ScopeInfo) and
// reports, from inside, what V8's CallSite says of it; or, for the
// uncompiled ones, never called. Run with --allow-natives-syntax
// --expose-gc: prints one %DebugPrint per case (stdout), in order, then
// the cases as one JSON line on stderr ("CASES [...]"), then "READY", and
// waits (no allocation, so no GC moves the objects) until stdin closes.
'use strict';

function site() {
  const prepare = Error.prepareStackTrace;
  Error.prepareStackTrace = (_, s) => s;
  const s = new Error().stack[2];
  Error.prepareStackTrace = prepare;
  return {
    name: s.getFunctionName(),
    file: s.getFileName(),
    line: s.getLineNumber(),
    column: s.getColumnNumber(),
  };
}
function here() { return site(); }

function named() { return here(); }
const anonymous = [function () { return here(); }][0];
function Foo() {}
Foo.prototype.bar = function () { return here(); };
Foo.baz = function () { return here(); };
const arrow = () => here();
const trulyAnonymous = (f => f)(function () { return here(); });
class Klass {
  method() { return here(); }
  static staticMethod() { return here(); }
  get getter() { return here(); }
  #secret() { return here(); }
  callSecret() { return this.#secret(); }
}
const obj = { shorthand() { return here(); }, prop: function () { return here(); } };
const selfRef = function inner(n) { return n ? inner(n - 1) : here(); };
function closures() {
  let a = 1, b = 2, c = 3, d = 4, e = 5, f = 6, g = 7;
  const use = () => a + b + c + d + e + f + g;
  use();
  return here();
}
function closureReturner() {
  let x = 1, y = 2;
  return function returned() { x += y; return here(); };
}
const returned = closureReturner();
const many = new Function('here',
  Array.from({ length: 100 }, (_, i) => `let v${i} = ${i};`).join('\n') +
  '\nconst all = () => ' + Array.from({ length: 100 }, (_, i) => `v${i}`).join('+') +
  ';\nall();\nreturn here();');
function withDefaults(a = 1, { b } = { b: 2 }) { return here(); }
function ñandú() { return here(); }
function 名前() { return here(); }
exports.exported = function () { return here(); };
module.exports.nested = { deeper: { fn: function () { return here(); } } };
const computedName = 'comp' + String(Date.now() % 1);
const computed = { [computedName + 'uted']: function () { return here(); } }[computedName + 'uted'];
function* generator() { yield here(); }
async function asyncFn() { return here(); }
function aVeryLongFunctionNameThatGoesOnAndOnAndOnBeyondAnyReasonableLengthForAFunctionNameInJavaScript() { return here(); }
function neverCalled() { return 1; }
const neverCalledInferred = {};
neverCalledInferred.inferredNever = function () { return 2; };

const cases = [
  ['named', named, () => named()],
  ['anonymous', anonymous, () => anonymous()],
  ['prototype method', Foo.prototype.bar, () => new Foo().bar()],
  ['static assigned', Foo.baz, () => Foo.baz()],
  ['arrow', arrow, () => arrow()],
  ['passed as an argument', trulyAnonymous, () => trulyAnonymous()],
  ['class method', Klass.prototype.method, () => new Klass().method()],
  ['static class method', Klass.staticMethod, () => Klass.staticMethod()],
  ['getter', Object.getOwnPropertyDescriptor(Klass.prototype, 'getter').get, () => new Klass().getter],
  ['shorthand', obj.shorthand, () => obj.shorthand()],
  ['property function', obj.prop, () => obj.prop()],
  ['named expression', selfRef, () => selfRef(2)],
  ['context locals', closures, () => closures()],
  ['returned closure', returned, () => returned()],
  ['100 context locals', many, () => many(here)],
  ['defaults', withDefaults, () => withDefaults()],
  ['latin1 name', ñandú, () => ñandú()],
  ['two-byte name', 名前, () => 名前()],
  ['exports', exports.exported, () => exports.exported()],
  ['nested exports', module.exports.nested.deeper.fn, () => module.exports.nested.deeper.fn()],
  ['computed', computed, () => computed()],
  ['generator', generator, () => generator().next().value],
  ['async', asyncFn, null],
  ['long name', aVeryLongFunctionNameThatGoesOnAndOnAndOnBeyondAnyReasonableLengthForAFunctionNameInJavaScript,
    () => aVeryLongFunctionNameThatGoesOnAndOnAndOnBeyondAnyReasonableLengthForAFunctionNameInJavaScript()],
  ['never called', neverCalled, undefined],
  // Node's own code: its script named node:path, its source external.
  ['node builtin', require('path').join, undefined],
  ['never called, inferred', neverCalledInferred.inferredNever, undefined],
];

async function main() {
  const out = [];
  for (const [label, fn, call] of cases) {
    let s = null;
    if (call === null) {
      for (let i = 0; i < 20; i++) s = await fn();
    } else if (call !== undefined) {
      for (let i = 0; i < 20; i++) s = call();
    }
    out.push({ label, fnName: fn.name, position: %FunctionGetScriptSourcePosition(fn), site: s });
  }
  gc(); gc();
  for (const [, fn] of cases) %DebugPrint(fn);
  process.stderr.write('CASES ' + JSON.stringify(out) + '\n');
  process.stderr.write('READY\n');
  process.stdin.resume();
  process.stdin.on('end', () => process.exit(0));
}
main();
