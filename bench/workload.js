'use strict'
// The workload every section shares: a broker's topics × 16 partitions × 2 groups, built with the
// same numbers in a surface and in a prom-client Registry holding the equivalent 15 families, and
// the scrape through the surface's own handler (the Buffer the HTTP server sends).
//
// Realistic on purpose (a render over short names and small numbers flatters a text renderer):
// dotted topic names of ~20 characters (`tenant-07.orders-1234`), counters spread from thousands to
// millions, and the render rows change one topic before every scrape, as a live broker does.
// 43 samples per topic (5 topic counters, 2 × 16 partition gauges, 3 × 2 group series) plus the 7
// broker-wide ones: 4,348 topics are 186,971 samples, the "200k" surface the targets are stated for.
const path = require('node:path')
const { DIST } = require('./harness')

const MAX_IN_FLIGHT = 0x7fffffff
const PARTITIONS = 16
const GROUPS = ['billing', 'audit']
const SAMPLES_PER_TOPIC = 5 + 2 * PARTITIONS + 3 * GROUPS.length
/** ~1k, ~10k, ~100k, 187k and 1M samples. */
const SIZES = [24, 233, 2326, 4348, 23255]
const BIG = 4348
const TEN_K = 233
const MILLION = 23255

const KINDS = ['orders', 'payments', 'telemetry', 'audit-log', 'sessions', 'inventory', 'alerts']

/** Topic t's name: `tenant-07.orders-1234` (19–24 characters). */
function topicName(t) {
  return `tenant-${String(t % 64).padStart(2, '0')}.${KINDS[t % KINDS.length]}-${1000 + t}`
}

/** A deterministic hash of (a, b) in [0, 1). */
function unit(a, b) {
  let x = Math.imul(a ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(b + 0x7f4a7c15, 0xc2b2ae35)
  x ^= x >>> 15
  x = Math.imul(x, 0x2c1b3c6d)
  x ^= x >>> 12
  return (x >>> 0) / 2 ** 32
}

/** Partition p's last seq in topic t: log-uniform from 1,000 to 2,000,000. */
function seqOf(t, p) {
  return Math.floor(1000 * 2000 ** unit(t, p))
}
/** Group g's ack floor: a few to a few thousand messages behind. */
function floorOf(t, p, g) {
  const seq = seqOf(t, p)
  return seq - Math.min(seq >> 1, Math.floor(5 ** (1 + 4 * unit(t * 31 + g, p))))
}
function retriesOf(t, g) {
  return Math.floor(10 ** (1 + 4 * unit(t, 1000 + g)))
}

function buildOurs(lib, topics, extra = {}, options = undefined) {
  const surface = lib.createSurface({ max_in_flight: MAX_IN_FLIGHT, max_topics: 100000, e2e_latency: true, ...extra }, options)
  for (let t = 0; t < topics; t++) {
    const topic = surface.topic(topicName(t))
    const groups = GROUPS.map((name) => topic.group(name))
    const delivered = GROUPS.map(() => 0)
    for (let p = 0; p < PARTITIONS; p++) {
      const seq = seqOf(t, p)
      topic.produced(p, seq, seq * 180, seq)
      for (let g = 0; g < groups.length; g++) {
        groups[g].ackFloor(p, floorOf(t, p, g))
        delivered[g] += floorOf(t, p, g)
      }
    }
    // Conservation holds (docs/design.md): every message up to the floor was delivered, none in flight.
    for (let g = 0; g < groups.length; g++) {
      if (!groups[g].dispatch(delivered[g])) throw new Error('bench: dispatch refused')
      groups[g].delivered(delivered[g])
      groups[g].redelivered(retriesOf(t, g))
    }
  }
  for (let i = 0; i < 1000; i++) surface.latency.record(1 + (i % 50) * 0.7)
  return surface
}

function buildPromClient(promClient, METRICS, topics) {
  const registry = new promClient.Registry()
  const make = {}
  for (const m of METRICS) {
    const Kind = m.type === 'counter' ? promClient.Counter : promClient.Gauge
    make[m.name] = new Kind({ name: m.name, help: m.help, labelNames: [...m.labels], registers: [registry] })
  }
  make.mq_broker_uptime_seconds.set(process.uptime())
  make.mq_connections.set(0)
  make.mq_leader_epoch.set(0)
  make.mq_quorum_state.set(0)
  for (let t = 0; t < topics; t++) {
    const topic = topicName(t)
    let produced = 0
    let bytes = 0
    let delivered = 0
    for (let p = 0; p < PARTITIONS; p++) {
      const seq = seqOf(t, p)
      produced += seq
      bytes += seq * 180
      let slowest = Infinity
      for (let g = 0; g < GROUPS.length; g++) {
        slowest = Math.min(slowest, floorOf(t, p, g))
        delivered += floorOf(t, p, g)
      }
      make.mq_partition_depth.labels(topic, String(p)).set(seq - slowest)
      make.mq_partition_last_seq.labels(topic, String(p)).set(seq)
    }
    make.mq_topic_messages_produced_total.labels(topic).inc(produced)
    make.mq_topic_messages_delivered_total.labels(topic).inc(delivered)
    make.mq_topic_messages_dropped_total.labels(topic).inc(0)
    make.mq_topic_messages_dlq_total.labels(topic).inc(0)
    make.mq_topic_bytes_total.labels(topic).inc(bytes)
    for (let g = 0; g < GROUPS.length; g++) {
      let lag = 0
      for (let p = 0; p < PARTITIONS; p++) lag = Math.max(lag, seqOf(t, p) - floorOf(t, p, g))
      make.mq_group_lag.labels(topic, GROUPS[g]).set(lag)
      make.mq_group_in_flight.labels(topic, GROUPS[g]).set(0)
      make.mq_group_retries_total.labels(topic, GROUPS[g]).inc(retriesOf(t, g))
    }
  }
  for (const quantile of ['p50', 'p90', 'p99']) make.mq_e2e_latency_ms.labels(quantile).set(12.5)
  registry.make = make
  return registry
}

/**
 * A live broker between two scrapes: one more message on one topic, the next one each call (the
 * same change in both libraries). The surface's text cache must render that topic again.
 */
function changer(surface, registry, topics) {
  const handles = new Map()
  /** Each library's own cursor and seqs: the same sequence of changes in both. */
  const next = { ours: 0, promClient: 0 }
  const seqs = { ours: new Map(), promClient: new Map() }
  const step = (library) => {
    const t = next[library]++ % topics
    const seq = (seqs[library].get(t) ?? seqOf(t, 0)) + 1
    seqs[library].set(t, seq)
    return { t, seq }
  }
  return {
    ours() {
      const { t, seq } = step('ours')
      let topic = handles.get(t)
      if (!topic) handles.set(t, (topic = surface.topic(topicName(t))))
      topic.produced(0, seq, 180)
    },
    promClient() {
      const { t, seq } = step('promClient')
      const name = topicName(t)
      registry.make.mq_topic_messages_produced_total.labels(name).inc(1)
      registry.make.mq_topic_bytes_total.labels(name).inc(180)
      registry.make.mq_partition_last_seq.labels(name, '0').set(seq)
      registry.make.mq_partition_depth.labels(name, '0').inc(1)
    },
  }
}

/**
 * GET `path` through the surface's own handler: the Buffer the HTTP server sends (no gzip). A
 * large /metrics body is rendered in slices, so the answer may come a few event-loop turns later.
 * The response behaves as node:http's does where the handler looks: once the body is handed over
 * (on the next turn, as a socket would) it emits 'finish', then 'close', and the scrape is complete
 * then. On 'finish' the handler gives the body's buffer back to the renderer, so the next scrape
 * renders into it, as a server's scrapes do; on 'close' it stops counting the body among the bytes
 * still being sent (without it, the bound on those answers 503 SCRAPES_IN_FLIGHT after a few
 * hundred scrapes).
 */
function handled(surface, path, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = { url: path, method: 'GET', headers }
    const listeners = { finish: [], close: [] }
    const res = {
      statusCode: 0, headersSent: false, destroyed: false,
      setHeader() {},
      once(event, listener) {
        listeners[event]?.push(listener)
        return res
      },
      end(chunk) {
        if (!Buffer.isBuffer(chunk)) return reject(new Error(`bench: ${path} was not answered with a Buffer`))
        // What the caller reads of the body (its length, or its text right away) is read before
        // its next scrape, the only thing that could write into a recycled buffer.
        setImmediate(() => {
          for (const listener of listeners.finish) listener()
          for (const listener of listeners.close) listener()
          resolve(chunk)
        })
      },
    }
    if (!surface.handler(req, res)) reject(new Error(`bench: ${path} was not handled`))
  })
}

function scrapeBuffer(surface) {
  return handled(surface, '/metrics')
}

/** GET /metrics as Prometheus asks for it (Accept-Encoding: gzip): the gzip body. */
function scrapeGzip(surface) {
  return handled(surface, '/metrics', { 'accept-encoding': 'gzip' })
}

function countSamples(text) {
  let samples = 0
  for (const line of text.split('\n')) if (line !== '' && line[0] !== '#') samples++
  return samples
}

/** CPU seconds this process's thread `tid` has run (the library's /proc reader), or undefined. */
function threadCpuSeconds(tid) {
  const progress = tid === undefined ? undefined : require(path.join(DIST, 'core', 'threads.js')).threadProgress(tid)
  return progress === undefined ? undefined : progress.cpuNs / 1e9
}

module.exports = {
  MAX_IN_FLIGHT, PARTITIONS, GROUPS, SAMPLES_PER_TOPIC, SIZES, BIG, TEN_K, MILLION,
  topicName, seqOf, floorOf, retriesOf, buildOurs, buildPromClient, changer,
  handled, scrapeBuffer, scrapeGzip, countSamples, threadCpuSeconds,
}
