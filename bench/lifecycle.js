'use strict'
// The per-message lifecycle a broker records for every message: append at publish, send at
// dispatch, settle at ack (and, for one message in ten, a redelivery before the ack), on 8 topics
// × 4 partitions × 2 groups, acks arriving out of order within a window of 64 messages. Against
// prom-client doing what a broker does with it for the same events: produced and bytes counters at
// publish, an in-flight gauge up at dispatch, a retries counter, and at ack the gauge down and a
// delivered counter up (prom-client keeps no floors, no windows and no seqs: it does less).
// Rounds alternate between the two; medians of ns per message and their ratio are printed.
// --caught-up: consumers that keep up, as in a live MQTT broker: each message is appended, sent to
// every group and settled at once (no window of 64, no redelivery) — every call meets a new seq.
//
//   node bench/lifecycle.js [--messages N] [--rounds R] [--caught-up]
const path = require('node:path')
const client = require('prom-client')
const { createSurface } = require(path.join(__dirname, '..', 'dist'))

const { flag } = require('./harness')
const argv = process.argv.slice(2)
const MESSAGES = flag('--messages', 1_000_000)
const ROUNDS = flag('--rounds', 7)
const TOPICS = 8
const PARTITIONS = 4
const GROUPS = 2
const CAUGHT_UP = argv.includes('--caught-up')
const WINDOW = CAUGHT_UP ? 1 : 64
const REDELIVER_EVERY = CAUGHT_UP ? Infinity : 10

/** Acks out of order: the order in which a window's messages are settled (a fixed shuffle). */
const order = Array.from({ length: WINDOW }, (_, i) => i)
for (let i = WINDOW - 1, x = 7; i > 0; i--) { x = (x * 1103515245 + 12345) % 2 ** 31; const j = x % (i + 1); [order[i], order[j]] = [order[j], order[i]] }

function mqMetrics(surface) {
  const topics = Array.from({ length: TOPICS }, (_, t) => surface.topic(`tenant-${t}.orders`))
  const groups = topics.map((topic) => Array.from({ length: GROUPS }, (_, g) => topic.group(`consumer-${g}`, { max_in_flight: 1 << 20 })))
  const seqs = new Float64Array(WINDOW)
  return (messages) => {
    for (let done = 0; done < messages; done += WINDOW) {
      const t = (done / WINDOW) % TOPICS
      const p = (done / WINDOW / TOPICS) % PARTITIONS | 0
      const topic = topics[t]
      for (let i = 0; i < WINDOW; i++) seqs[i] = topic.append(p, 512)
      for (const group of groups[t]) {
        for (let i = 0; i < WINDOW; i++) group.send(p, seqs[i])
        for (let i = 0; i < WINDOW; i += REDELIVER_EVERY) group.redeliver(p, seqs[i])
        for (let i = 0; i < WINDOW; i++) group.settle(p, seqs[order[i]], 'delivered')
      }
    }
  }
}

function promClient(registry) {
  const labels = ['topic', 'partition']
  const produced = new client.Counter({ name: 'produced_total', help: 'h', labelNames: labels, registers: [registry] })
  const bytes = new client.Counter({ name: 'bytes_total', help: 'h', labelNames: labels, registers: [registry] })
  const groupLabels = ['topic', 'group']
  const inFlight = new client.Gauge({ name: 'in_flight', help: 'h', labelNames: groupLabels, registers: [registry] })
  const delivered = new client.Counter({ name: 'delivered_total', help: 'h', labelNames: groupLabels, registers: [registry] })
  const retries = new client.Counter({ name: 'retries_total', help: 'h', labelNames: groupLabels, registers: [registry] })
  // Children resolved once, as a careful prom-client user does.
  const topics = Array.from({ length: TOPICS }, (_, t) => ({
    partitions: Array.from({ length: PARTITIONS }, (_, p) => ({ produced: produced.labels(`tenant-${t}.orders`, String(p)), bytes: bytes.labels(`tenant-${t}.orders`, String(p)) })),
    groups: Array.from({ length: GROUPS }, (_, g) => ({
      inFlight: inFlight.labels(`tenant-${t}.orders`, `consumer-${g}`),
      delivered: delivered.labels(`tenant-${t}.orders`, `consumer-${g}`),
      retries: retries.labels(`tenant-${t}.orders`, `consumer-${g}`),
    })),
  }))
  return (messages) => {
    for (let done = 0; done < messages; done += WINDOW) {
      const t = (done / WINDOW) % TOPICS
      const p = (done / WINDOW / TOPICS) % PARTITIONS | 0
      const topic = topics[t]
      const partition = topic.partitions[p]
      for (let i = 0; i < WINDOW; i++) { partition.produced.inc(); partition.bytes.inc(512) }
      for (const group of topic.groups) {
        for (let i = 0; i < WINDOW; i++) group.inFlight.inc()
        for (let i = 0; i < WINDOW; i += REDELIVER_EVERY) group.retries.inc()
        for (let i = 0; i < WINDOW; i++) { group.inFlight.dec(); group.delivered.inc() }
      }
    }
  }
}

function time(run) {
  const started = process.hrtime.bigint()
  run(MESSAGES)
  return Number(process.hrtime.bigint() - started) / MESSAGES
}

const surface = createSurface()
let faults = 0
surface.on('fault', () => faults++)
const ours = mqMetrics(surface)
const theirs = promClient(new client.Registry())
ours(MESSAGES / 10) // warm-up
theirs(MESSAGES / 10)
const rows = { ours: [], theirs: [] }
for (let r = 0; r < ROUNDS; r++) {
  for (const which of r % 2 ? ['theirs', 'ours'] : ['ours', 'theirs']) rows[which].push(time(which === 'ours' ? ours : theirs))
}
const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
const a = median(rows.ours)
const b = median(rows.theirs)
console.log(`per message (append, send ×${GROUPS}, settle ×${GROUPS}${CAUGHT_UP ? ', each settled at once' : ', a redelivery in ten'}), median of ${ROUNDS} interleaved rounds of ${MESSAGES.toLocaleString('en-US')} messages, backend ${surface.backend}:`)
console.log(`  mq-metrics   ${a.toFixed(1)} ns`)
console.log(`  prom-client  ${b.toFixed(1)} ns (counters and a gauge only)`)
console.log(`  ratio        ${(b / a).toFixed(2)}× (prom-client / mq-metrics)`)
if (faults !== 0) { console.error(`${faults} faults: the workload is wrong`); process.exitCode = 1 }
surface.close()
