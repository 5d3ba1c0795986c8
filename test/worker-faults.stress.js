'use strict'
// The worker fault ring (lib/core/worker-faults.ts) under real threads paused at random: 4
// workers send records, each pausing at every Atomics call of send() and, now and then, for
// hundreds of milliseconds inside its copy; the consumer drains in a loop on a clock that moves
// STUCK_GAP_MS per drain, so such a worker is skipped and goes on late, often while the ring has
// come round to its slot again. Every record delivered must be whole (its two labels agree: no
// mixed text), delivered once and in its worker's order; records and suppressed summaries must
// account for every fault counted, exactly. One lap over a late worker is forced (the fixture's
// `sync`): worker 0 parks inside its first copy until another has found that slot's writer cell
// held, so the give-up path runs in every run; the random pauses add more. test/worker-faults.test.js
// forces each interleaving deterministically; this looks for the ones nobody thought of. Seeded:
// a failure replays.
const t = require('tap')
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const { WorkerFaultChannel, STUCK_GAP_MS, RING_SLOTS } = require('../dist/core/worker-faults')
const { Memory } = require('../dist/core/memory')
const { createArena } = require('../dist/core/backend')
const { backends, prng } = require('./helpers')

const PRODUCER = path.join(__dirname, 'fixtures', 'ring-producer.js')
const THREADS = 4
const PER = 6000

function run(backend, seed) {
  const arena = createArena(backend)
  const main = new Memory(arena, true)
  main.claimRow()
  let clock = 0
  const consumer = new WorkerFaultChannel(main, () => clock)
  const errors = []
  const seen = new Set()
  const last = new Array(THREADS).fill(-1)
  let records = 0
  let suppressed = 0
  let held = 0
  const sync = new SharedArrayBuffer(8)
  const take = (out) => {
    for (const f of out) {
      if (f.code === 'FAULTS_SUPPRESSED') { suppressed += f.attempted; continue }
      records++
      const group = f.labels.group
      const match = /^t(\d+)s(\d+)$/.exec(group)
      if (f.labels.mirror !== [...group].reverse().join('') || match === null) { errors.push(`mixed or garbled: ${JSON.stringify(f.labels)}`); continue }
      if (seen.has(group)) errors.push(`delivered twice: ${group}`)
      seen.add(group)
      const [thread, n] = [Number(match[1]), Number(match[2])]
      if (n <= last[thread]) errors.push(`out of order: worker ${thread}'s ${n} after ${last[thread]}`)
      last[thread] = n
    }
  }
  // The consumer pauses too, now and then, while it reads a record's text.
  const random = prng(seed)
  const nap = new Int32Array(new SharedArrayBuffer(4))
  const fromCharCode = String.fromCharCode
  let draining = false
  String.fromCharCode = function (...codes) {
    if (draining && random() < 0.001) Atomics.wait(nap, 0, 0, 0.5 + random() * 2)
    return fromCharCode.apply(String, codes)
  }
  const drain = () => {
    clock += STUCK_GAP_MS
    draining = true
    try { take(consumer.drain()) } finally { draining = false }
  }
  return new Promise((resolve) => {
    let done = 0
    const deadline = Date.now() + 120_000
    for (let id = 0; id < THREADS; id++) {
      const worker = new Worker(PRODUCER, { workerData: { shared: arena.share(), sync, late: 0, lap: 3 * RING_SLOTS, id, per: PER, long: 0.00005, longMs: 300, short: 0.001, seed: seed * 100 + id + 1 }, execArgv: [] })
      worker.on('message', (m) => { held += m.held })
      worker.on('error', (error) => errors.push(String(error)))
      worker.on('exit', () => done++)
    }
    const loop = () => {
      for (let k = 0; k < 50; k++) drain()
      if (done < THREADS && Date.now() < deadline) return setImmediate(loop)
      for (let k = 0; k < 20; k++) drain()
      String.fromCharCode = fromCharCode
      if (done < THREADS) errors.push(`${THREADS - done} workers still running after 120 s`)
      const sent = consumer.counts().get('DLQ_WITHOUT_DROP') ?? 0
      resolve({ sent, records, suppressed, held, errors })
    }
    setImmediate(loop)
  })
}

for (const backend of backends()) {
  for (const seed of [14, 3]) {
    t.test(`${backend}, seed ${seed}: records whole, once, in order; records and summaries account for every fault`, async (t) => {
      const r = await run(backend, seed)
      t.same(r.errors.slice(0, 10), [], `no mixed, garbled, repeated or reordered record (${r.records} records, ${r.suppressed} suppressed)`)
      t.equal(r.sent, THREADS * PER, 'every fault counted')
      t.equal(r.records + r.suppressed, r.sent, 'delivered + suppressed = sent, exactly')
      t.ok(r.held > 0, `late workers were met in their slots: the give-up path ran ${r.held} times`)
    })
  }
}
