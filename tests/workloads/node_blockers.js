// Node.js threads blocked where the profiler must name their JavaScript
// frames (tests/it/node.rs): each thread prints its own view of its stack
// (V8's call sites, innermost first) just before it blocks, then blocks
// until killed.
//   main      a synchronous read of a FIFO (fs.readSync), argv[2]
//   atomics   a worker in Atomics.wait
//   exec      a worker in child_process.execSync
//   hot       a worker whose hot function, optimized with a callee
//             inlined into it, ends up blocking in Atomics.wait
// Output: `THREAD label` then `FRAME name file:line:column` lines,
// innermost first; `READY` after the main thread's, which blocks last.
'use strict';
const { Worker, isMainThread, workerData, parentPort } = require('worker_threads');
const fs = require('fs');
const cp = require('child_process');

// The calling thread's stack as V8 reports it, innermost first, without
// this function's own frame.
function ownStack() {
  const prepare = Error.prepareStackTrace;
  Error.prepareStackTrace = (_, sites) => sites;
  const sites = new Error().stack;
  Error.prepareStackTrace = prepare;
  return sites.slice(1).map((s) => ({
    name: s.getFunctionName() || '<anonymous>',
    file: s.getFileName(),
    line: s.getLineNumber(),
    column: s.getColumnNumber(),
  }));
}

// Printed at once (a worker's console goes through the main thread, which
// blocks); the main thread, which blocks last, says READY after.
function report(label, frames) {
  let out = `THREAD ${label}\n`;
  for (const f of frames) out += `FRAME ${f.name} ${f.file}:${f.line}:${f.column}\n`;
  if (label === 'main') out += 'READY\n';
  fs.writeSync(1, out);
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

function execMain() {
  runChild();
}

// Inlined into hotLoop once optimized; blocks when told to.
function hotStep(cells, i) {
  if (i < 0) {
    report('hot', ownStack());
    Atomics.wait(cells, 0, 0);
  }
  return (i * 7) & 1023;
}

function hotLoop(cells, rounds) {
  let sum = 0;
  for (let i = rounds; i >= -1; i--) sum += hotStep(cells, i);
  return sum;
}

function hotMain() {
  const cells = new Int32Array(workerData.shared);
  // Warm up until optimized, then run once more to block.
  for (let k = 0; k < 200; k++) hotLoop(cells, 5000 + k);
  hotLoop(cells, 5000);
}

if (isMainThread) {
  const shared = new SharedArrayBuffer(16);
  const workers = ['atomics', 'exec', 'hot'].map(
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
  // Told the main thread first: the blocking call comes right after.
  const { role } = workerData;
  parentPort.postMessage(role);
  setTimeout(() => {
    if (role === 'atomics') atomicsMain();
    else if (role === 'exec') execMain();
    else hotMain();
  }, 50);
}
