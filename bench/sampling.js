'use strict'
// The measuring loop every bench section shares: samples of ≥ SAMPLE_MS, rounds
// interleaved across candidates (the first one a discarded warm-up), medians. Every result is
// summed into `sink`, checked by checkSink(), so the JIT cannot drop the work being timed.
const { performance } = require('node:perf_hooks')

const SAMPLE_MS = 100
let sink = 0

/**
 * ns per operation over one sample of ≥ SAMPLE_MS. `candidate.run(n)` does n operations and
 * returns a number, an array-like or a promise of either; the batch starts at `firstBatch` (1)
 * and doubles until one batch takes ~1/10 of the sample, so the clock is read rarely.
 */
async function sample(candidate) {
  let batch = candidate.batch ?? candidate.firstBatch ?? 1
  let operations = 0
  const start = performance.now()
  let elapsed = 0
  while (elapsed < SAMPLE_MS) {
    const batchStart = performance.now()
    let result = candidate.run(batch)
    if (result !== null && typeof result === 'object' && typeof result.then === 'function') result = await result
    consume(result)
    const now = performance.now()
    operations += batch
    elapsed = now - start
    if (now - batchStart < SAMPLE_MS / 10) batch *= 2
  }
  candidate.batch = batch
  return (elapsed * 1e6) / operations
}

/** Interleaved rounds over `candidates`; returns each one's per-round ns/op (warm-up round dropped). */
async function rounds(candidates, count) {
  const timings = candidates.map(() => [])
  for (let round = 0; round <= count; round++) {
    for (let c = 0; c < candidates.length; c++) {
      const ns = await sample(candidates[c])
      if (round > 0) timings[c].push(ns)
    }
  }
  return timings
}

/** Keeps a result alive: a number, or anything with a length. */
function consume(result) {
  sink += typeof result === 'number' ? result : result.length
}

function checkSink() {
  if (!Number.isFinite(sink)) throw new Error('bench: a loop produced a non-finite result')
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b)
  const middle = sorted.length >> 1
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
}

function percentile(values, p) {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]
}

module.exports = { SAMPLE_MS, sample, rounds, consume, checkSink, median, percentile }
