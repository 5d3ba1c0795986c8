'use strict'
// Hot path: the recording calls a broker makes per message, on resolved handles, against the
// cheapest way to do the same with prom-client (every child resolved once).
// - delivered: `group.delivered()` with in_flight available (a large dispatch first) vs a child
//   counter `inc()`.
// - produced: `topic.produced(p, seq, bytes)` (produced, bytes, last_seq + its checks) over 16
//   partitions vs `inc()` + `inc(bytes)` + a 2-label gauge `set(seq)`.
// - dispatch: `group.dispatch()` (the in_flight bound checked across threads) vs a gauge `inc()`.
// Reproduce: node bench/hot.js [--quick]
const { rounds } = require('./sampling')
const { formatNs, formatRatio, pass, row, standalone, summarise } = require('./harness')
const { MAX_IN_FLIGHT, PARTITIONS } = require('./workload')

async function run({ lib, promClient, rounds: count }) {
  const surface = lib.createSurface({ max_in_flight: MAX_IN_FLIGHT })
  const topic = surface.topic('orders')
  const group = topic.group('billing')
  let available = 0
  const ensureInFlight = (n) => {
    if (available >= n) return
    const amount = Math.min(MAX_IN_FLIGHT - available, 1_500_000_000)
    if (!group.dispatch(amount)) throw new Error('bench: dispatch refused')
    available += amount
  }
  // Each partition's seqs run 1, 2, 3, … (a gap is refused: SEQ_GAP).
  const seqs = new Array(PARTITIONS).fill(0)

  const registry = new promClient.Registry()
  const delivered = new promClient.Counter({ name: 'mq_topic_messages_delivered_total', help: 'h', labelNames: ['topic'], registers: [registry] })
  const produced = new promClient.Counter({ name: 'mq_topic_messages_produced_total', help: 'h', labelNames: ['topic'], registers: [registry] })
  const bytes = new promClient.Counter({ name: 'mq_topic_bytes_total', help: 'h', labelNames: ['topic'], registers: [registry] })
  const lastSeq = new promClient.Gauge({ name: 'mq_partition_last_seq', help: 'h', labelNames: ['topic', 'partition'], registers: [registry] })
  const inFlight = new promClient.Gauge({ name: 'mq_group_in_flight', help: 'h', labelNames: ['topic', 'group'], registers: [registry] })
  const deliveredChild = delivered.labels('orders')
  const producedChild = produced.labels('orders')
  const bytesChild = bytes.labels('orders')
  const lastSeqChildren = Array.from({ length: PARTITIONS }, (_, p) => lastSeq.labels('orders', String(p)))
  const inFlightChild = inFlight.labels('orders', 'billing')
  let promSeq = 0

  const candidates = [
    {
      operation: 'delivered', library: 'ours', firstBatch: 1024,
      run(n) {
        ensureInFlight(n)
        for (let i = 0; i < n; i++) group.delivered()
        available -= n
        return available
      },
    },
    {
      operation: 'delivered', library: 'promClient', firstBatch: 1024,
      run(n) {
        for (let i = 0; i < n; i++) deliveredChild.inc()
        return n
      },
    },
    {
      operation: 'produced', library: 'ours', firstBatch: 1024,
      run(n) {
        for (let i = 0; i < n; i++) {
          const p = i & (PARTITIONS - 1)
          topic.produced(p, ++seqs[p], 100)
        }
        return seqs[0]
      },
    },
    {
      operation: 'produced', library: 'promClient', firstBatch: 1024,
      run(n) {
        for (let i = 0; i < n; i++) {
          producedChild.inc()
          bytesChild.inc(100)
          lastSeqChildren[i & (PARTITIONS - 1)].set(++promSeq)
        }
        return promSeq
      },
    },
    {
      operation: 'dispatch', library: 'ours', firstBatch: 1024,
      run(n) {
        let accepted = 0
        for (let i = 0; i < n; i++) if (group.dispatch()) accepted++
        available += accepted
        return accepted
      },
    },
    {
      operation: 'dispatch', library: 'promClient', firstBatch: 1024,
      run(n) {
        for (let i = 0; i < n; i++) inFlightChild.inc()
        return n
      },
    },
  ]
  const timings = await rounds(candidates, count)
  await surface.close()
  const results = summarise(candidates, timings)
  const d = results.delivered
  const p = results.produced
  const x = results.dispatch
  return {
    results,
    rows: [
      row('one counter increment on a resolved handle: `group.delivered()` vs child `inc()`', formatNs(d.promClientNs), formatNs(d.oursNs), formatRatio(d.ratio), '≤ 5 ns, ≥ 20×', pass(d.oursNs <= 5 && d.ratio >= 20)),
      row('a publish: `topic.produced(p, seq, bytes)` vs `inc()` + `inc(bytes)` + 2-label gauge `set()`', formatNs(p.promClientNs), formatNs(p.oursNs), formatRatio(p.ratio), '≤ 15 ns, ≥ 30×', pass(p.oursNs <= 15 && p.ratio >= 30)),
      row('`group.dispatch()` (in_flight bound checked across threads) vs gauge child `inc()`', formatNs(x.promClientNs), formatNs(x.oursNs), formatRatio(x.ratio), '—', 'info'),
    ],
  }
}

module.exports = { run }
standalone(module, 'hot', run)
