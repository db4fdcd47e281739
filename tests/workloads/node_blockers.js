// Node.js threads blocked where the profiler must name their JavaScript
// frames (tests/it/node.rs): each thread prints its own view of its stack
// (V8's call sites, innermost first) just before it blocks, then blocks
// until killed.
//   main      a synchronous read of a FIFO (fs.readSync), argv[2]
//   atomics   a worker in Atomics.wait
//   exec      a worker in child_process.execSync, under a function of
//             baseline code (Sparkplug's)
//   hot       a worker whose hot function, optimized with a callee
//             inlined into it, ends up blocking in Atomics.wait
//   maglev    the same under functions of its own, optimized by Maglev
//             (where V8 has Maglev on by default: Node 24)
// Output: `WORKERS n` first, then `THREAD label` then `FRAME name file:line:column` lines,
// innermost first (each thread blocks on the line after the one it
// reports from); `READY` after the main thread's, which blocks last;
// `OPTIMIZED hotLoop true|false` before the hot thread's (whether V8 says
// the hot function is optimized by TurboFan: run node with
// --allow-natives-syntax for it to be said and to be so for certain), and
// `OPTIMIZED maglevLoop ...` before the maglev thread's (by Maglev);
// `BASELINE execMain true|false` likewise before the exec thread's.
'use strict';
const { Worker, isMainThread, workerData, parentPort } = require('worker_threads');
const fs = require('fs');
const cp = require('child_process');

// The calling thread's stack as V8 reports it, innermost first, without
// this function's own frame: a `FRAME name file:line:column` line each.
// (Error.prepareStackTrace is set once, and the lines are made with no
// object or array of this program's: under the hot function's optimized
// code a shape that changes would have V8 deoptimize it.)
Error.prepareStackTrace = (_, sites) => sites;
function ownStack() {
  const sites = new Error().stack;
  let out = '';
  for (let k = 1; k < sites.length; k++) {
    const s = sites[k];
    out += `FRAME ${s.getFunctionName() || '<anonymous>'} ${s.getFileName()}:${s.getLineNumber()}:${s.getColumnNumber()}\n`;
  }
  return out;
}

// Printed at once (a worker's console goes through the main thread, which
// blocks); the main thread, which blocks last, says READY after. A worker
// then tells the main thread that it blocks next (the hot one tells it
// before its last run: its optimized code is not to meet a path it has
// not taken).
function report(label, frames, fd = 1) {
  fs.writeSync(fd, `THREAD ${label}\n${frames}${label === 'main' ? 'READY\n' : ''}`);
  if (label === 'atomics' || label === 'exec') parentPort.postMessage(label);
}

function readInner(fd) {
  const buf = Buffer.alloc(16);
  report('main', ownStack());
  return fs.readSync(fd, buf, 0, 16, null);
}

function readOuter(fd) {
  return readInner(fd);
}

function waitHere(cells) {
  report('atomics', ownStack());
  Atomics.wait(cells, 0, 0);
}

function atomicsMain() {
  waitHere(new Int32Array(workerData.shared));
}

function runChild() {
  report('exec', ownStack());
  cp.execSync('sleep 100000', { stdio: 'ignore' });
}

// Baseline code: the statement after the call has a position of its own,
// so that a frame placed one bytecode off is on the wrong line.
function execMain() {
  runChild();
  return 1;
}

// V8's own test functions (`%OptimizeFunctionOnNextCall`), where node runs
// with --allow-natives-syntax: the hot function optimized for certain.
const natives = process.execArgv.includes('--allow-natives-syntax');
const native = (name) => (natives ? new Function('f', `return %${name}(f)`) : () => 0);
const prepare = native('PrepareFunctionForOptimization');
const optimizeNext = native('OptimizeFunctionOnNextCall');
const optimizeMaglevNext = native('OptimizeMaglevOnNextCall');
const neverOptimize = native('NeverOptimizeFunction');
const status = native('GetOptimizationStatus');
const compileBaseline = native('CompileBaseline');
// Waits for the optimizations under way on other threads.
const finish = natives ? new Function('%FinalizeOptimization()') : () => 0;

// Inlined into hotLoop once optimized. Every 1024th step it reports the
// thread's stack to `fd` and waits on cell 0 while it holds `expect`:
// warming up, /dev/null and a value the cell does not hold (the wait
// returns at once), so that the optimized code has been through every
// path it takes when it blocks and is not deoptimized on the way.
function hotStep(cells, i, expect, fd) {
  if ((i & 1023) === 0) {
    report('hot', ownStack(), fd);
    Atomics.wait(cells, 0, expect);
  }
  return (i * 7) & 1023;
}

function hotLoop(cells, rounds, expect, fd) {
  let sum = 0;
  for (let i = rounds; i >= 0; i--) sum += hotStep(cells, i, expect, fd);
  return sum;
}

// The same for Maglev.
function maglevStep(cells, i, expect, fd) {
  if ((i & 1023) === 0) {
    report('maglev', ownStack(), fd);
    Atomics.wait(cells, 0, expect);
  }
  return (i * 7) & 1023;
}

function maglevLoop(cells, rounds, expect, fd) {
  let sum = 0;
  for (let i = rounds; i >= 0; i--) sum += maglevStep(cells, i, expect, fd);
  return sum;
}

// Warms `loop` up, has it optimized (by TurboFan, or by Maglev where
// `maglev`), says whether V8 says so (its kTurboFanned or kMaglevved bit;
// 0 without natives), then runs it to its block.
function optimizeAndBlock(loop, maglev) {
  const cells = new Int32Array(workerData.shared);
  const devnull = fs.openSync('/dev/null', 'w');
  prepare(loop);
  for (let k = 0; k < (natives ? 3 : 300); k++) {
    loop(cells, 4096, 1, devnull);
    finish();
  }
  (maglev ? optimizeMaglevNext : optimizeNext)(loop);
  loop(cells, 4096, 1, devnull);
  finish();
  fs.writeSync(1, `OPTIMIZED ${loop.name} ${(status(loop) & (maglev ? 32 : 64)) !== 0}\n`);
  parentPort.postMessage(loop.name);
  loop(cells, 4096, 0, 1);
}

function hotMain() {
  neverOptimize(hotMain);
  optimizeAndBlock(hotLoop, false);
}

function maglevMain() {
  neverOptimize(maglevMain);
  optimizeAndBlock(maglevLoop, true);
}

if (isMainThread) {
  const shared = new SharedArrayBuffer(16);
  // Maglev where V8 turns it on by default (V8 13: Node 24).
  const maglev = Number(process.versions.v8.split('.')[0]) >= 13;
  // There, Maglev's code tiers up to TurboFan's of itself once it has run
  // long enough (on another thread, installed at the next call or at
  // %FinalizeOptimization): the maglev thread's function was now and then
  // TurboFan's, not Maglev's, when it blocked. TurboFan only when asked
  // (flags of the whole process, set before the workers start).
  if (maglev) {
    require('v8').setFlagsFromString(
      '--invocation-count-for-turbofan=100000 --invocation-count-for-osr=100000 --no-osr-from-maglev'
    );
  }
  const roles = ['atomics', 'exec', 'hot'].concat(maglev ? ['maglev'] : []);
  fs.writeSync(1, `WORKERS ${roles.length}\n`);
  const workers = roles.map(
    (role) => new Worker(__filename, { workerData: { role, shared } })
  );
  let ready = 0;
  for (const w of workers) {
    w.on('message', () => {
      if (++ready === workers.length) {
        // The main thread reports and blocks last.
        const fd = fs.openSync(process.argv[2], 'r+');
        setTimeout(() => readOuter(fd), 200);
      }
    });
  }
} else {
  // Each tells the main thread when it is about to block (see report).
  const { role } = workerData;
  setTimeout(() => {
    if (role === 'atomics') atomicsMain();
    else if (role === 'exec') {
      compileBaseline(execMain);
      // V8's kBaseline bit.
      fs.writeSync(1, `BASELINE execMain ${(status(execMain) & 32768) !== 0}\n`);
      execMain();
    }
    else if (role === 'hot') hotMain();
    else maglevMain();
  }, 50);
}
