// Two Node.js worker threads passing the turn back and forth
// (Atomics.wait and Atomics.notify on shared memory), each under DEPTH
// functions of its own: a context switch per pass, every one in a Node.js
// process (scripts/bench-builds --node). After WARM passes (the JIT's work
// done), prints the time per round trip of the ROUNDS that follow.
//
//     node nodeping.js ROUNDS [DEPTH] [WARM]
'use strict';
const { Worker, isMainThread, workerData } = require('worker_threads');

function nest(depth, body) {
  return depth === 0 ? body() : nest(depth - 1, body);
}

// Waits for the turn of `me`, then gives it to the other thread.
function pass(cells, me) {
  while (Atomics.load(cells, 0) !== me) Atomics.wait(cells, 0, 1 - me);
  Atomics.store(cells, 0, 1 - me);
  Atomics.notify(cells, 0);
}

if (isMainThread) {
  const rounds = Number(process.argv[2] || 20000);
  const depth = Number(process.argv[3] || 10);
  const warm = Number(process.argv[4] || 20000);
  const shared = new SharedArrayBuffer(16);
  const done = [0, 1].map(
    (me) =>
      new Promise((resolve) => {
        const w = new Worker(__filename, { workerData: { shared, me, rounds, depth, warm } });
        w.on('message', resolve);
      })
  );
  Promise.all(done).then(([ns]) => {
    console.log(`${(ns / rounds).toFixed(1)} ns/op`);
  });
} else {
  const { shared, me, rounds, depth, warm } = workerData;
  const cells = new Int32Array(shared);
  const { parentPort } = require('worker_threads');
  nest(depth, () => {
    let started = 0n;
    for (let i = 0; i < warm + rounds; i++) {
      if (i === warm) started = process.hrtime.bigint();
      pass(cells, me);
    }
    parentPort.postMessage(Number(process.hrtime.bigint() - started));
  });
}
