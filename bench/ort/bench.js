// node bench.js MODEL.onnx BATCH THREADS REPEAT -> median ms
const ort = require('onnxruntime-node');
(async () => {
  const [model, B, T, R] = [process.argv[2], +process.argv[3], +process.argv[4], +(process.argv[5] || 7)];
  const s = await ort.InferenceSession.create(model, {intraOpNumThreads: T, interOpNumThreads: 1,
                                                     graphOptimizationLevel: 'all'});
  const x = new ort.Tensor('float32', Float32Array.from({length: B * 3 * 224 * 224}, () => Math.random() * 2 - 1), [B, 3, 224, 224]);
  for (let i = 0; i < 2; i++) await s.run({x});
  const ts = [];
  for (let i = 0; i < R; i++) { const t = process.hrtime.bigint(); await s.run({x}); ts.push(Number(process.hrtime.bigint() - t) / 1e6); }
  ts.sort((a, b) => a - b);
  console.log(JSON.stringify({model, batch: B, threads: T, median_ms: ts[ts.length >> 1], min_ms: ts[0],
                               maxrss_kb: process.resourceUsage().maxRSS}));
})();
