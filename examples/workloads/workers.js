// Node: the main thread builds 1.5 M small objects, then three
// worker_threads each build a Map of 600 k string keys and fold it; prints
// the count and the three digests (819 MB peak, ~1.9 s natively here).
// Under a budget the faults come from four threads at once.
//
// usage: node workers.js [SCALE]   (SCALE scales every count; default 1)
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');
if (isMainThread) {
  const scale = Number(process.argv[2] || 1);
  const big = [];
  for (let i = 0; i < 1500000 * scale; i++) big.push({ i, s: 'x'.repeat(i % 30) });
  let done = 0;
  const out = [];
  for (let w = 0; w < 3; w++) {
    const wk = new Worker(__filename, { workerData: { w, scale } });
    wk.on('message', (m) => {
      out[w] = m;
      if (++done === 3) console.log(big.length, out.join(','));
    });
  }
} else {
  const { w, scale } = workerData;
  const m = new Map();
  for (let i = 0; i < 600000 * scale; i++) m.set('k' + i * (w + 1), [i, 'v'.repeat(i % 20)]);
  let h = 0;
  for (const [k, v] of m) h = (h * 31 + k.length + v[0]) % 1000000007;
  parentPort.postMessage(h);
}
