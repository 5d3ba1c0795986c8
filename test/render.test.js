'use strict'
// The /metrics renderer (design §2, §3) against hand-reviewed golden files, byte for byte, and
// against a deliberately naive reference renderer on seeded random snapshots. Run
// `npx tsc -p tsconfig.json` first. `UPDATE_GOLDEN=1` rewrites test/golden/*.prom — review every
// changed line against design §2 and §3 before committing one.
const t = require('tap')
const fs = require('node:fs')
const path = require('node:path')
const { spawnSync } = require('node:child_process')
const { Renderer } = require('../dist/exposition/render.js')
const { formatFloat, writeDigits } = require('../dist/exposition/digits.js')
const { METRICS, METRICS_CONTENT_TYPE } = require('../dist/exposition/allowlist.js')
const { sanitizeLabelValue, escapeLabelValue, escapeHelp } = require('../dist/core/labels.js')
const { prng, steppingClock, backends, surfaceOn } = require('./helpers')

const GOLDEN = path.join(__dirname, 'golden')
const TWO_53 = 2 ** 53

// --- building snapshots the way lib/core/reader.ts does ---------------------------------------------

function byLabelThenName(a, b) {
  if (a.label !== b.label) return a.label < b.label ? -1 : 1
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0
}

function sum(values) {
  let total = 0n
  for (const v of values) total += BigInt(v)
  return total <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(total) : total
}

/**
 * A Snapshot as lib/core/snapshot.ts describes it. `partitions` is { number: lastSeq }; each group
 * gives its ack floor per partition (missing = 0); depth and lag are derived as design §4 says and
 * the topic's delivered/dropped/dlq are its groups' sums.
 */
function topicOf(name, { produced = 0, bytes = 0, partitions = {}, groups = [] } = {}) {
  const numbers = Object.keys(partitions).map(Number).sort((a, b) => a - b)
  const lastSeqs = numbers.map((p) => partitions[p])
  const groupSnapshots = groups.map((g) => {
    const ackFloors = numbers.map((p) => (g.floors && g.floors[p]) || 0)
    const behind = lastSeqs.map((lastSeq, i) => lastSeq - ackFloors[i])
    return {
      name: g.name,
      label: sanitizeLabelValue(g.name),
      delivered: g.delivered ?? 0,
      dropped: g.dropped ?? 0,
      dlq: g.dlq ?? 0,
      retries: g.retries ?? 0,
      inFlight: g.inFlight ?? 0,
      maxInFlight: 1000,
      lag: Math.max(0, ...behind),
      depth: behind.reduce((a, b) => a + b, 0),
      ackFloors,
      key: {},
    }
  }).sort(byLabelThenName)
  return {
    name,
    label: sanitizeLabelValue(name),
    produced,
    bytes,
    delivered: sum(groupSnapshots.map((g) => g.delivered)),
    dropped: sum(groupSnapshots.map((g) => g.dropped)),
    dlq: sum(groupSnapshots.map((g) => g.dlq)),
    partitionNumbers: numbers,
    lastSeq: lastSeqs,
    depth: numbers.map((partition, i) => {
      const slowest = groupSnapshots.length ? Math.min(...groupSnapshots.map((g) => g.ackFloors[i])) : 0
      return lastSeqs[i] - slowest
    }),
    groups: groupSnapshots,
    key: {},
  }
}

function snapshotOf({ uptimeSeconds = 0, connections = 0, leaderEpoch = 0, quorumState = 0, latency = null, topics = [] } = {}) {
  return { uptimeSeconds, connections, leaderEpoch, quorumState, replicas: 0, inSync: 0, latency, topics: [...topics].sort(byLabelThenName) }
}

// --- the golden cases ---------------------------------------------------------------------------

const cases = {
  // Every family's HELP and TYPE, in allowlist order, with only the four broker-wide samples.
  empty: () => snapshotOf(),

  busy: () => snapshotOf({
    uptimeSeconds: 3725.5,
    connections: 42,
    leaderEpoch: 7,
    quorumState: 1,
    latency: { p50: 1.5, p90: 12.25, p99: 250.125, count: 1000 },
    topics: [
      topicOf('orders', {
        produced: 1500,
        bytes: 768000,
        partitions: { 0: 600, 1: 500, 2: 400, 10: 0 },
        groups: [
          { name: 'billing', floors: { 0: 590, 1: 500, 2: 380 }, delivered: 1460, dropped: 3, dlq: 2, retries: 17, inFlight: 12 },
          { name: 'shipping', floors: { 0: 600, 1: 450, 2: 400 }, delivered: 1440, dropped: 0, dlq: 0, retries: 0, inFlight: 50 },
        ],
      }),
      topicOf('payments', {
        produced: 90,
        bytes: 4096,
        partitions: { 0: 30, 1: 30, 2: 20, 3: 10 },
        groups: [{ name: 'audit', floors: { 0: 30, 1: 29, 2: 20, 3: 10 }, delivered: 89, retries: 1, inFlight: 1 }],
      }),
      topicOf('events', { produced: 5, bytes: 250, partitions: { 0: 5 } }),
      topicOf('idle'),
    ],
  }),

  // design §3.1: each code point outside [A-Za-z0-9_-] becomes one `_` (an emoji and a lone
  // surrogate included); `a.b` and `a b` therefore share one series.
  sanitize: () => snapshotOf({
    topics: [
      topicOf('a.b', { produced: 1, partitions: { 0: 1 }, groups: [{ name: 'g.1', delivered: 1, floors: { 0: 1 } }] }),
      topicOf('a b', { produced: 2, partitions: { 0: 2 } }),
      topicOf('ä', { produced: 3, partitions: { 1: 3 } }),
      topicOf('😀x', { produced: 4, groups: [{ name: '😀😀', retries: 4 }] }),
      topicOf('q"b\\s\nn', { produced: 5, groups: [{ name: 'say "hi"\\\n', inFlight: 5 }] }),
      topicOf('\ud800z', { produced: 6 }),
      topicOf('Keep-this_0', { produced: 7 }),
    ],
  }),

  // design §3.5: three raw topics share the label `a_b`; partitions and groups overlap between them
  // and two groups of one topic collide with each other.
  collisions: () => snapshotOf({
    topics: [
      topicOf('a.b', {
        produced: 100,
        bytes: 1000,
        partitions: { 0: 10, 1: 5 },
        groups: [
          { name: 'g.1', floors: { 0: 4, 1: 5 }, delivered: 9, dropped: 1, dlq: 1, retries: 2, inFlight: 3 },
          { name: 'g 1', floors: { 0: 8, 1: 1 }, delivered: 12, retries: 5, inFlight: 4 },
          { name: 'x', floors: { 0: 10, 1: 5 }, delivered: 15 },
        ],
      }),
      topicOf('a b', {
        produced: 20,
        bytes: 200,
        partitions: { 1: 7, 2: 3 },
        groups: [
          { name: 'g_1', floors: { 1: 7, 2: 0 }, delivered: 7, dropped: 2, retries: 1, inFlight: 6 },
          { name: 'y', floors: { 1: 2, 2: 3 }, delivered: 5 },
        ],
      }),
      topicOf('a_b', { produced: 3, bytes: 30, partitions: { 2: 9 } }),
      topicOf('b', { produced: 1, bytes: 10, partitions: { 0: 1 }, groups: [{ name: 'x', floors: { 0: 1 }, delivered: 1 }] }),
    ],
  }),

  // design §2: counters are 64-bit and print exactly above 2^53, including sums made by a merge.
  'big-counters': () => {
    const u64max = 2n ** 64n - 1n
    const snapshot = snapshotOf({
      connections: TWO_53 - 1,
      leaderEpoch: 4294967296,
      topics: [
        topicOf('huge', {
          produced: u64max,
          bytes: TWO_53 - 1,
          partitions: { 0: TWO_53 - 1 },
          groups: [{ name: 'g', delivered: 2n ** 53n + 1n, dropped: 2n ** 60n, dlq: 2n ** 60n - 1n, retries: 12345678901234567890n, floors: { 0: 1 } }],
        }),
        // Two safe numbers whose exact sum (9007199254741001) is not a safe number.
        topicOf('sum.x', { produced: TWO_53 - 1, bytes: 2 ** 52, partitions: { 0: TWO_53 - 2 }, groups: [{ name: 'g', retries: TWO_53 - 1, inFlight: 7 }] }),
        topicOf('sum x', { produced: 10, bytes: 2 ** 52, partitions: { 0: 3 }, groups: [{ name: 'g', retries: 10, inFlight: 8 }] }),
      ],
    })
    return snapshot
  },
}

function golden(name) {
  return path.join(GOLDEN, `${name}.prom`)
}

t.test('golden files, byte for byte', async (t) => {
  for (const [name, build] of Object.entries(cases)) {
    const body = new Renderer().render(build())
    t.ok(Buffer.isBuffer(body), `${name}: render returns a Buffer`)
    if (process.env.UPDATE_GOLDEN) {
      fs.mkdirSync(GOLDEN, { recursive: true })
      fs.writeFileSync(golden(name), body)
    }
    const expected = fs.readFileSync(golden(name))
    // Compared as bytes; on a mismatch the text diff shows where the exposition went wrong.
    if (!body.equals(expected)) t.equal(body.toString('utf8'), expected.toString('utf8'), `${name}.prom differs from the output`)
    else t.pass(`${name}.prom matches byte for byte`)
  }
})

t.test('the same snapshot renders to identical bytes, cached or not', async (t) => {
  for (const [name, build] of Object.entries(cases)) {
    const snapshot = build()
    const renderer = new Renderer()
    const first = renderer.render(snapshot)
    const again = renderer.render(snapshot) // label text now comes from the cache
    const fresh = new Renderer().render(snapshot)
    t.ok(first.equals(again), `${name}: a second render of the same snapshot is byte-identical`)
    t.ok(first.equals(fresh), `${name}: a renderer with a warm cache writes what a cold one writes`)
    t.ok(first.buffer !== again.buffer || first.byteOffset !== again.byteOffset,
      `${name}: each render returns its own bytes (a body still being sent is never overwritten)`)
  }
})

t.test('every family has HELP and TYPE, in allowlist order, and nothing else is emitted', async (t) => {
  t.equal(METRICS.length, 15, 'design §2: exactly 15 families')
  t.ok(Object.isFrozen(METRICS) && METRICS.every((m) => Object.isFrozen(m) && Object.isFrozen(m.labels)), 'the allowlist cannot be mutated')
  t.equal(METRICS_CONTENT_TYPE, 'text/plain; version=0.0.4; charset=utf-8')
  for (const name of Object.keys(cases)) {
    const text = fs.readFileSync(golden(name), 'utf8')
    const comments = text.split('\n').filter((line) => line.startsWith('#'))
    const expected = METRICS.flatMap((m) => [`# HELP ${m.name} ${escapeHelp(m.help)}`, `# TYPE ${m.name} ${m.type}`])
    t.same(comments, expected, `${name}: HELP/TYPE lines are the allowlist's, in its order`)
    t.ok(text.endsWith('\n') && !text.includes('\n\n'), `${name}: every line ends in \\n, no blank lines`)
    const names = METRICS.map((m) => m.name)
    let family = -1
    for (const line of text.split('\n').filter((l) => l && !l.startsWith('#'))) {
      const metric = line.match(/^[a-z_0-9]+/)[0]
      const index = names.indexOf(metric)
      t.ok(index >= 0 && index >= family, `${name}: ${metric} is allowlisted and in order`)
      family = index
    }
  }
})

t.test('no two samples share a name and label set', async (t) => {
  for (const name of Object.keys(cases)) {
    const series = fs.readFileSync(golden(name), 'utf8').split('\n')
      .filter((l) => l && !l.startsWith('#')).map((l) => l.slice(0, l.lastIndexOf(' ')))
    t.equal(new Set(series).size, series.length, `${name}: ${series.length} distinct series`)
  }
})

t.test('collisions merge as design §3.5 says', async (t) => {
  const text = new Renderer().render(cases.collisions()).toString('utf8')
  const sample = (series) => {
    const line = text.split('\n').find((l) => l.startsWith(series + ' '))
    return line && line.slice(series.length + 1)
  }
  const table = [
    // topics a.b + a b + a_b
    ['mq_topic_messages_produced_total{topic="a_b"}', '123', 'produced summed'],
    ['mq_topic_bytes_total{topic="a_b"}', '1230', 'bytes summed'],
    ['mq_topic_messages_delivered_total{topic="a_b"}', '48', 'delivered summed over all groups of all three'],
    ['mq_topic_messages_dropped_total{topic="a_b"}', '3', 'dropped summed'],
    ['mq_topic_messages_dlq_total{topic="a_b"}', '1', 'dlq summed'],
    ['mq_partition_last_seq{topic="a_b",partition="0"}', '10', 'partition 0 only in a.b'],
    ['mq_partition_last_seq{topic="a_b",partition="1"}', '7', 'last_seq is the maximum (5 vs 7)'],
    ['mq_partition_last_seq{topic="a_b",partition="2"}', '9', 'last_seq is the maximum (3 vs 9)'],
    ['mq_partition_depth{topic="a_b",partition="0"}', '6', 'depth 10 − min(4, 8, 10)'],
    ['mq_partition_depth{topic="a_b",partition="1"}', '9', 'depth summed: (5 − 1) + (7 − 2)'],
    ['mq_partition_depth{topic="a_b",partition="2"}', '12', 'depth summed: (3 − 0) + (9 − 0)'],
    ['mq_group_lag{topic="a_b",group="g_1"}', '6', 'lag is the maximum of g.1 (6), g 1 (4) and g_1 (3)'],
    ['mq_group_in_flight{topic="a_b",group="g_1"}', '13', 'in_flight summed: 3 + 4 + 6'],
    ['mq_group_retries_total{topic="a_b",group="g_1"}', '8', 'retries summed: 2 + 5 + 1'],
    ['mq_group_lag{topic="a_b",group="x"}', '0', 'a group only in one topic stays as it is'],
    ['mq_group_lag{topic="a_b",group="y"}', '5', 'y: max(7 − 2, 3 − 3)'],
    ['mq_group_lag{topic="b",group="x"}', '0', 'same group label under another topic is another series'],
  ]
  for (const [series, value, why] of table) t.equal(sample(series), value, `${series}: ${why}`)
})

t.test('integers above 2^53 print exactly', async (t) => {
  const text = new Renderer().render(cases['big-counters']()).toString('utf8')
  const table = [
    ['mq_connections 9007199254740991', 'the largest safe integer'],
    ['mq_leader_epoch 4294967296', 'an integer above 2^32'],
    ['mq_topic_messages_produced_total{topic="huge"} 18446744073709551615', 'u64 max as a bigint'],
    ['mq_topic_messages_delivered_total{topic="huge"} 9007199254740993', '2^53 + 1, which a double cannot hold'],
    ['mq_group_retries_total{topic="huge",group="g"} 12345678901234567890', 'a 20-digit counter'],
    ['mq_topic_messages_produced_total{topic="sum_x"} 9007199254741001', 'a merged sum past 2^53, exact'],
    ['mq_topic_bytes_total{topic="sum_x"} 9007199254740992', 'a merged sum of exactly 2^53'],
    ['mq_group_retries_total{topic="sum_x",group="g"} 9007199254741001', 'a merged group counter past 2^53'],
    ['mq_partition_depth{topic="sum_x",partition="0"} 9007199254740993', 'merged depth (2^53 − 2) + 3, exact'],
    ['mq_partition_last_seq{topic="sum_x",partition="0"} 9007199254740990', 'merged last_seq takes the maximum'],
  ]
  for (const [line, why] of table) t.ok(text.split('\n').includes(line), `${line}: ${why}`)
})

t.test('formatFloat: shortest round trip, NaN and ±Inf as Prometheus spells them', async (t) => {
  const table = [
    [0, '0'], [-0, '0'], [1.5, '1.5'], [0.1, '0.1'], [1 / 3, '0.3333333333333333'], [1e21, '1e+21'],
    [5e-324, '5e-324'], [-2.5, '-2.5'], [NaN, 'NaN'], [Infinity, '+Inf'], [-Infinity, '-Inf'],
    [TWO_53, '9007199254740992'],
  ]
  for (const [value, expected] of table) t.equal(formatFloat(value), expected, `formatFloat(${value})`)
  for (const [value, expected] of table.filter(([v]) => Number.isFinite(v))) {
    t.equal(Number(formatFloat(value)), value, `${expected} reads back as the same double`)
  }
  for (const [uptime, expected] of [[NaN, 'NaN'], [Infinity, '+Inf'], [-Infinity, '-Inf'], [0.001, '0.001']]) {
    const text = new Renderer().render(snapshotOf({ uptimeSeconds: uptime })).toString('utf8')
    t.ok(text.includes(`\nmq_broker_uptime_seconds ${expected}\n`), `uptime ${uptime} renders as ${expected}`)
  }
  const latency = { p50: NaN, p90: Infinity, p99: 0.000123, count: 1 }
  const text = new Renderer().render(snapshotOf({ latency })).toString('utf8')
  t.ok(text.endsWith('mq_e2e_latency_ms{quantile="p50"} NaN\nmq_e2e_latency_ms{quantile="p90"} +Inf\nmq_e2e_latency_ms{quantile="p99"} 0.000123\n'),
    'latency quantiles are floats, in p50, p90, p99 order')
})

t.test('labels: sanitize per code point, then escape (design §3.1–3.3)', async (t) => {
  const sanitize = [
    ['orders', 'orders', 'allowed characters pass'],
    ['Az09_-', 'Az09_-', 'the whole allowed set'],
    ['a-b.c_D9', 'a-b_c_D9', 'the allowed set kept where one character is not (the per-character path)'],
    ['a.b', 'a_b', 'a dot'],
    ['a b', 'a_b', 'a space'],
    ['ä', '_', 'a two-byte UTF-8 character is one _'],
    ['😀x', '_x', 'an emoji (surrogate pair) is one _'],
    ['\ud800', '_', 'a lone high surrogate is one _'],
    ['\udc00x', '_x', 'a lone low surrogate is one _'],
    ['\ud800\ud800\udc00', '__', 'a lone high surrogate then a pair: two code points'],
    ['"\\\n', '___', 'quote, backslash and newline'],
  ]
  for (const [raw, expected, why] of sanitize) t.equal(sanitizeLabelValue(raw), expected, `sanitize ${JSON.stringify(raw)}: ${why}`)
  const escape = [
    ['plain', 'plain', 'nothing to escape'],
    ['a\\b', 'a\\\\b', 'backslash doubled'],
    ['a"b', 'a\\"b', 'quote escaped'],
    ['a\nb', 'a\\nb', 'newline as \\n'],
    ['\\"\n', '\\\\\\"\\n', 'all three'],
  ]
  for (const [raw, expected, why] of escape) t.equal(escapeLabelValue(raw), expected, `escape ${JSON.stringify(raw)}: ${why}`)
  t.equal(escapeHelp('a "q" \\ and\nnext'), 'a "q" \\\\ and\\nnext', 'HELP escapes backslash and newline, leaves quotes')

  // Defence in depth: a future caller that hands the renderer an unsanitized label still gets a
  // parseable exposition, because the escape runs on the output side even though it is a no-op
  // for sanitized labels.
  const topic = topicOf('x', { produced: 1, partitions: { 0: 1 }, groups: [{ name: 'g', floors: { 0: 1 } }] })
  topic.label = 'a"b\\c\nd'
  topic.groups[0].label = 'g"\n'
  const text = new Renderer().render(snapshotOf({ topics: [topic] })).toString('utf8')
  t.ok(text.includes('mq_topic_messages_produced_total{topic="a\\"b\\\\c\\nd"} 1\n'), 'topic label escaped')
  t.ok(text.includes('mq_partition_depth{topic="a\\"b\\\\c\\nd",partition="0"} 0\n'), 'partition line escaped')
  t.ok(text.includes('mq_group_lag{topic="a\\"b\\\\c\\nd",group="g\\"\\n"} 0\n'), 'group label escaped')
})

t.test('the label cache follows the snapshot, not the key', async (t) => {
  // A key reused with another label (never done by lib/core/reader.ts, but the cache must not trust
  // it), groups added and removed under a cached topic, and a snapshot handed over unsorted.
  const renderer = new Renderer()
  const a = topicOf('alpha', { produced: 1, groups: [{ name: 'g1' }] })
  t.equal(render(renderer, [a]), reference(snapshotOf({ topics: [a] })), 'first render')
  const b = { ...topicOf('beta', { produced: 2, groups: [{ name: 'g1' }, { name: 'g2' }] }), key: a.key }
  b.groups[0].key = a.groups[0].key
  t.equal(render(renderer, [b]), reference(snapshotOf({ topics: [b] })), 'same key, new label: new text')
  const c = { ...b, groups: [b.groups[1]] }
  t.equal(render(renderer, [c]), reference(snapshotOf({ topics: [c] })), 'a group gone from a cached topic')
  const unsorted = snapshotOf({ topics: [topicOf('z', { produced: 1 }), topicOf('y.y', { produced: 2 }), topicOf('y y', { produced: 3 })] })
  unsorted.topics.reverse()
  t.equal(new Renderer().render(unsorted).toString('utf8'), reference(unsorted), 'unsorted topics are sorted, collisions still merged')
  const noKey = topicOf('n', { produced: 1, groups: [{ name: 'g' }] })
  noKey.key = undefined
  noKey.groups[0].key = undefined
  t.equal(render(renderer, [noKey]), reference(snapshotOf({ topics: [noKey] })), 'a topic without a key renders uncached')

  function render(r, topics) {
    return r.render({ ...snapshotOf(), topics }).toString('utf8')
  }
})

// --- a deliberately naive reference renderer: Maps, BigInt and string concatenation ------------

/**
 * The naive exposition of `snapshot`; `carries` (label → what removed names left in the label's
 * series: counters, last_seq by partition, retries by group label) added where a live name keeps
 * the series (design §3.5).
 */
function reference(snapshot, carries = new Map()) {
  const num = (v) => (typeof v === 'bigint' || Number.isSafeInteger(v) ? BigInt(v).toString() : formatFloatReference(v))
  const topics = new Map()
  for (const topic of snapshot.topics) {
    let m = topics.get(topic.label)
    if (!m) topics.set(topic.label, (m = { produced: 0n, delivered: 0n, dropped: 0n, dlq: 0n, bytes: 0n, partitions: new Map(), groups: new Map() }))
    for (const k of ['produced', 'delivered', 'dropped', 'dlq', 'bytes']) m[k] += BigInt(topic[k])
    topic.partitionNumbers.forEach((partition, i) => {
      const q = m.partitions.get(partition) || { depth: 0n, lastSeq: 0 }
      m.partitions.set(partition, { depth: q.depth + BigInt(topic.depth[i]), lastSeq: Math.max(q.lastSeq, topic.lastSeq[i]) })
    })
    for (const g of topic.groups) {
      const q = m.groups.get(g.label) || { lag: 0, inFlight: 0n, retries: 0n }
      m.groups.set(g.label, { lag: Math.max(q.lag, g.lag), inFlight: q.inFlight + BigInt(g.inFlight), retries: q.retries + BigInt(g.retries) })
    }
  }
  for (const [label, carry] of carries) {
    const m = topics.get(label)
    if (m === undefined) continue
    for (const k of ['produced', 'delivered', 'dropped', 'dlq', 'bytes']) m[k] += carry[k]
    for (const [p, lastSeq] of carry.lastSeq) { const q = m.partitions.get(p); if (q !== undefined && lastSeq > q.lastSeq) q.lastSeq = lastSeq }
    for (const [g, retries] of carry.retries) { const q = m.groups.get(g); if (q !== undefined) q.retries += retries }
  }
  const labels = [...topics.keys()].sort()
  const esc = escapeLabelValue
  let out = ''
  const head = (i) => { out += `# HELP ${METRICS[i].name} ${escapeHelp(METRICS[i].help)}\n# TYPE ${METRICS[i].name} ${METRICS[i].type}\n` }
  head(0); out += `mq_broker_uptime_seconds ${formatFloatReference(snapshot.uptimeSeconds)}\n`
  head(1); out += `mq_connections ${num(snapshot.connections)}\n`
  head(2); out += `mq_leader_epoch ${num(snapshot.leaderEpoch)}\n`
  head(3); out += `mq_quorum_state ${num(snapshot.quorumState)}\n`
  ;['produced', 'delivered', 'dropped', 'dlq', 'bytes'].forEach((k, i) => {
    head(4 + i)
    for (const l of labels) out += `${METRICS[4 + i].name}{topic="${esc(l)}"} ${topics.get(l)[k]}\n`
  })
  ;['depth', 'lastSeq'].forEach((k, i) => {
    head(9 + i)
    for (const l of labels) {
      for (const p of [...topics.get(l).partitions.keys()].sort((a, b) => a - b)) {
        out += `${METRICS[9 + i].name}{topic="${esc(l)}",partition="${p}"} ${num(topics.get(l).partitions.get(p)[k])}\n`
      }
    }
  })
  ;['lag', 'inFlight', 'retries'].forEach((k, i) => {
    head(11 + i)
    for (const l of labels) {
      for (const g of [...topics.get(l).groups.keys()].sort()) out += `${METRICS[11 + i].name}{topic="${esc(l)}",group="${esc(g)}"} ${num(topics.get(l).groups.get(g)[k])}\n`
    }
  })
  head(14)
  if (snapshot.latency) for (const q of ['p50', 'p90', 'p99']) out += `mq_e2e_latency_ms{quantile="${q}"} ${formatFloatReference(snapshot.latency[q])}\n`
  return out
}

function formatFloatReference(v) {
  return Number.isNaN(v) ? 'NaN' : v === Infinity ? '+Inf' : v === -Infinity ? '-Inf' : String(v)
}


t.test('random snapshots render exactly as the naive reference does', async (t) => {
  // Few characters, short names: collisions of topics and of groups are frequent.
  const alphabet = ['a', 'b', '.', ' ', '_', 'ä', '😀', '"', '\\', '\n', '\ud800']
  const random = prng(20240601)
  const pick = (list) => list[Math.floor(random() * list.length)]
  const name = () => Array.from({ length: 1 + Math.floor(random() * 3) }, () => pick(alphabet)).join('')
  const count = () => {
    const r = random()
    if (r < 0.1) return 2n ** 53n + BigInt(Math.floor(random() * 1e6)) // above 2^53
    if (r < 0.2) return TWO_53 - 1 - Math.floor(random() * 3) // sums of these pass 2^53
    return Math.floor(random() * 1e6)
  }
  const renderer = new Renderer() // shared across rounds: its cache must never leak old text
  let mismatches = 0
  for (let round = 0; round < 300; round++) {
    const topics = []
    const names = new Set()
    for (let i = Math.floor(random() * 8); i > 0; i--) {
      const topicName = name()
      if (names.has(topicName)) continue
      names.add(topicName)
      const partitions = {}
      for (let p = Math.floor(random() * 4); p > 0; p--) partitions[Math.floor(random() * 12)] = Math.floor(random() * 1000) + (random() < 0.1 ? TWO_53 - 2000 : 0)
      const groups = []
      const groupNames = new Set()
      for (let g = Math.floor(random() * 4); g > 0; g--) {
        const groupName = name()
        if (groupNames.has(groupName)) continue
        groupNames.add(groupName)
        const floors = {}
        for (const p of Object.keys(partitions)) floors[p] = Math.floor(random() * partitions[p])
        groups.push({ name: groupName, floors, delivered: count(), dropped: count(), dlq: count(), retries: count(), inFlight: Math.floor(random() * 1000) })
      }
      topics.push(topicOf(topicName, { produced: count(), bytes: count(), partitions, groups }))
    }
    const latency = random() < 0.5 ? null : { p50: random(), p90: random() * 10, p99: random() * 1000, count: 5 }
    const snapshot = snapshotOf({ uptimeSeconds: random() * 1e5, connections: Math.floor(random() * 100), leaderEpoch: round, quorumState: round % 3, latency, topics })
    const body = renderer.render(snapshot).toString('utf8')
    const expected = reference(snapshot)
    if (body !== expected) {
      mismatches++
      if (mismatches <= 3) t.equal(body, expected, `round ${round}: output equals the reference renderer`)
    }
  }
  t.equal(mismatches, 0, '300 random snapshots (collisions, bigints, escapes) match the reference')
})

t.test('the exposition grows its buffer when a scrape is much larger than the last', async (t) => {
  const renderer = new Renderer()
  renderer.render(snapshotOf()) // tiny: sizes the next buffer small
  const topics = []
  for (let i = 0; i < 300; i++) {
    const partitions = {}
    for (let p = 0; p < 8; p++) partitions[p] = i * 100 + p
    topics.push(topicOf(`topic-${i}`, { produced: 2n ** 63n + BigInt(i), partitions, groups: [{ name: 'g', retries: 2n ** 64n * 1000n }] }))
  }
  const snapshot = snapshotOf({ topics })
  t.equal(renderer.render(snapshot).toString('utf8'), reference(snapshot), 'a large scrape after a tiny one is complete')
  t.equal(renderer.render(snapshotOf()).toString('utf8'), reference(snapshotOf()), 'and a tiny one after it')
})

t.test('surface.render() of a body longer than a string can be is a RangeError that says what to do', async (t) => {
  // render-size.stress.js builds a real one (42,000 long names); here the limit is lowered.
  for (const backend of backends()) {
    const surface = surfaceOn(t, backend)
    surface.topic('orders').produced(0, 1, 1)
    // The body's length moves by a few bytes between renders (its timings): a limit well below it.
    const length = surface.render().length
    surface.maxRenderChars = length >> 1
    t.throws(() => surface.render(), { name: 'RangeError', message: new RegExp(`body is \\d+ bytes.*\\(${length >> 1}\\).*listen\\(\\)`) }, `${backend}: refused`)
    surface.maxRenderChars = length * 2
    t.match(surface.render(), /^# HELP mq_/, `${backend}: a body within the limit renders, and the refusal left the renderer usable`)
  }
})

// --- promtool ------------------------------------------------------------------------------------

t.test('promtool check metrics accepts every golden exposition', async (t) => {
  const bin = process.env.PROMTOOL || 'promtool'
  const probe = spawnSync(bin, ['--version'], { encoding: 'utf8' })
  if (probe.error) {
    if (process.env.CI) throw new Error(`CI: ${bin} is not installed (apt-get install prometheus)`)
    t.skip(`${bin} not installed; CI installs Debian's prometheus package`)
    return
  }
  // The findings design §2 forces, both on mq_e2e_latency_ms and nothing else:
  // - design §2 names the family `mq_e2e_latency_ms`: an abbreviated unit (ms), not base seconds.
  // - design §2 gives it a `quantile` label (p50/p90/p99) while its TYPE is gauge: the estimator is
  //   not a Prometheus summary (no _sum/_count, and the quantile values are not numbers).
  //   promtool reports this once per sample.
  // promtool lints only families that have samples, so these appear only when latency does.
  // Any other finding, or a parse error (exit 1, "error while linting"), fails.
  const forced = [
    'mq_e2e_latency_ms metric names should not contain abbreviated units',
    'mq_e2e_latency_ms non-summary metrics should not have "quantile" label',
    'mq_e2e_latency_ms non-summary metrics should not have "quantile" label',
    'mq_e2e_latency_ms non-summary metrics should not have "quantile" label',
  ]
  for (const name of Object.keys(cases)) {
    const run = spawnSync(bin, ['check', 'metrics'], { input: fs.readFileSync(golden(name)), encoding: 'utf8' })
    const findings = (run.stdout + run.stderr).split('\n').map((l) => l.trim()).filter(Boolean)
    const withLatency = name === 'busy'
    t.same(findings, withLatency ? forced : [], `${name}: ${withLatency ? 'only the findings design §2 forces' : 'no findings'}`)
    t.equal(run.status, withLatency ? 3 : 0, `${name}: promtool exits ${withLatency ? '3 (lint findings only)' : '0'}, not 1 (parse error)`)
  }
})

// --- rendering in slices (a large scrape must not block the event loop) -------------------------

t.test('a render advanced in slices writes exactly what a render in one go writes', async (t) => {
  // If this failed, a large /metrics body (rendered in slices) would differ from surface.render().
  const random = prng(8)
  const topics = []
  for (let i = 0; i < 300; i++) {
    const partitions = {}
    for (let p = 0; p < 1 + (i % 5); p++) partitions[p] = i * 10 + p
    topics.push(topicOf(`slice.${i % 250}`, { produced: Math.floor(random() * 1e6), partitions, groups: [{ name: 'g', floors: { 0: 1 } }, { name: `h${i % 3}` }] }))
  }
  const snapshot = snapshotOf({ topics, latency: { p50: 1, p90: 2, p99: 3, count: 4 } })
  const whole = new Renderer().render(snapshot)
  const renderer = new Renderer()
  const job = renderer.begin(snapshot)
  let steps = 1
  while (!job.step(0)) steps++ // a deadline long past: the job yields at every clock check
  t.ok(steps > 5, `the job yielded between slices (${steps} steps)`)
  t.ok(job.body().equals(whole), 'the sliced body is byte-identical (collisions, caches and all)')
  t.throws(() => renderer.begin(snapshot).body(), /not complete/, 'an unfinished job has no body to hand out')
})

/**
 * GET /metrics (with `headers`) on a clock that runs fast — every look at it is past the slice's
 * deadline, so the render yields every few dozen topics — while each turn of the event loop in
 * between records a new seq on every handle and removes one topic. Returns the answer (headers,
 * body), the exposition just before, and how many times the state moved during the scrape.
 */
async function scrapeWhileMeddling(t, surface, handles, headers, seq) {
  const before = surface.render()
  const realClock = steppingClock(t, 50) // every slice ends at its first clock check
  let slicesSeen = 0
  let done = false
  const answer = await new Promise((resolve, reject) => {
    const seen = {}
    const res = {
      statusCode: 0, headersSent: false, destroyed: false,
      setHeader(name, value) { seen[name.toLowerCase()] = value },
      end: (chunk) => { done = true; resolve({ headers: seen, body: chunk }) },
    }
    const meddle = () => {
      if (done) return
      slicesSeen++
      seq++
      for (const topic of handles) for (let p = 0; p < 4; p++) topic.append(p, 100)
      surface.removeTopic(handles.pop().name)
      setImmediate(meddle)
    }
    try {
      if (!surface.handler({ url: '/metrics', method: 'GET', headers }, res)) reject(new Error('not handled'))
      setImmediate(meddle)
    } catch (error) {
      reject(error)
    }
  })
  realClock()
  return { answer, before, slicesSeen }
}

const withoutUptime = (s) => s.replace(/^mq_broker_uptime_seconds .*$/m, '')

/**
 * A surface with `count` topics of 4 partitions at seq 10, and their handles. Unpaced
 * (scrapeShare 1): the fake clock of scrapeWhileMeddling() would otherwise put the pacer deep in
 * debt (test/pacing.test.js has a torn-scrape test with pacing on).
 */
function tornSurface(t, prefix, count) {
  const { lib } = require('./helpers.js')
  // On the main thread (scrapeThread: false): the slices and their yields are what is tested here;
  // the scrape thread renders in one go from its own snapshot (test/faults.test.js races it).
  const surface = lib.createSurface({ max_in_flight: 1_000_000 }, { scrapeShare: 1, scrapeThread: false })
  t.teardown(() => surface.close())
  const handles = []
  for (let i = 0; i < count; i++) {
    const topic = surface.topic(`${prefix}-${i}`)
    for (let p = 0; p < 4; p++) topic.produced(p, 10, 100)
    handles.push(topic)
  }
  return { surface, handles }
}

t.test('GET /metrics rendered in slices is one moment\'s numbers, never a torn scrape', async (t) => {
  // If this failed, recording or removing topics while a large scrape renders could mix numbers
  // from before and after into one body (design §2: same state ⇒ byte-identical output).
  const { surface, handles } = tornSurface(t, 'torn', 400)
  const { answer, before, slicesSeen } = await scrapeWhileMeddling(t, surface, handles, {}, 10)
  t.ok(slicesSeen > 3, `the state changed between slices (${slicesSeen} times before the body was complete)`)
  t.equal(withoutUptime(answer.body.toString('utf8')), withoutUptime(before), 'the body is the state at the start of the scrape, byte for byte')
  t.not(withoutUptime(surface.render()), withoutUptime(before), 'while the state itself did move on')
})

// --- the gzip render (Renderer.beginGzip / renderGzip) ------------------------------------------
const zlib = require('node:zlib')
const { CHUNK_TOPICS } = require('../dist/exposition/gzip-job.js')

t.test('the gzip render of every golden case gunzips to the golden bytes', async (t) => {
  // If this failed, a client asking for gzip (Prometheus always does) would see another exposition
  // than the reviewed golden one.
  for (const [name, build] of Object.entries(cases)) {
    const renderer = new Renderer()
    const snapshot = build()
    const first = zlib.gunzipSync(renderer.renderGzip(snapshot))
    const again = zlib.gunzipSync(renderer.renderGzip(snapshot)) // every chunk reused
    const expected = fs.readFileSync(golden(name))
    if (!first.equals(expected)) t.equal(first.toString('utf8'), expected.toString('utf8'), `${name}: gzip render differs from ${name}.prom`)
    else t.pass(`${name}: gunzipped, byte for byte ${name}.prom`)
    t.ok(again.equals(expected), `${name}: and again from reused chunks`)
  }
})

t.test('gzip chunks are reused exactly while every number and label in them is unchanged', async (t) => {
  // If this failed, a scrape could show a number from an earlier scrape: a chunk reused although
  // one of its values, labels, partitions or groups changed. Every kind of change is made in turn
  // on a random topic, alone, and the gzip body must then equal a fresh plain render.
  const random = prng(6060)
  const pickIndex = (n) => Math.floor(random() * n)
  const keys = new Map()
  const keyOf = (name) => {
    if (!keys.has(name)) keys.set(name, {})
    return keys.get(name)
  }
  // Topic specs, mutated in place; the snapshot is rebuilt from them each round with stable keys.
  const specs = []
  for (let i = 0; i < 5 * CHUNK_TOPICS + 7; i++) {
    specs.push({
      name: `chunky.${String(i).padStart(3, '0')}`,
      produced: 1000 + i,
      bytes: 9000 + i,
      partitions: { 0: 100 + i, 1: 200 + i, 3: 50 },
      groups: [
        { name: 'alpha', floors: { 0: 90, 1: 150 }, delivered: 500, dropped: 4, dlq: 1, retries: 3, inFlight: 2 },
        { name: 'beta', floors: { 0: 100, 1: 200, 3: 50 }, delivered: 600 },
      ],
    })
  }
  const build = () => snapshotOf({
    uptimeSeconds: 12,
    latency: { p50: 1, p90: 2, p99: 3, count: 3 },
    topics: specs.map((spec) => ({ ...topicOf(spec.name, spec), key: keyOf(spec.name) })),
  })
  const bump = (object, field) => {
    const step = 1 + pickIndex(5)
    object[field] = typeof object[field] === 'bigint' ? object[field] + BigInt(step) : (object[field] ?? 0) + step
  }
  const changes = {
    produced: (s) => bump(s, 'produced'),
    bytes: (s) => bump(s, 'bytes'),
    'bytes past 2^31 (no longer an int32)': (s) => { s.bytes = 2 ** 31 + pickIndex(3) },
    'a group\'s delivered (the topic total)': (s) => bump(s.groups[pickIndex(s.groups.length)], 'delivered'),
    'a group\'s dropped': (s) => bump(s.groups[pickIndex(s.groups.length)], 'dropped'),
    'a group\'s dlq': (s) => bump(s.groups[pickIndex(s.groups.length)], 'dlq'),
    'a group\'s retries': (s) => bump(s.groups[pickIndex(s.groups.length)], 'retries'),
    'a group\'s in_flight': (s) => bump(s.groups[pickIndex(s.groups.length)], 'inFlight'),
    'a partition\'s last_seq': (s) => bump(s.partitions, Object.keys(s.partitions)[pickIndex(Object.keys(s.partitions).length)]),
    'an ack floor (depth and lag)': (s) => { s.groups[0].floors[0] = (s.groups[0].floors[0] ?? 0) + 1 },
    'a new partition': (s) => { s.partitions[4 + pickIndex(20)] = 7 },
    'a new group': (s) => { s.groups.push({ name: `gamma${pickIndex(1000)}`, floors: {} }) },
    'the same numbers under another name': (s) => { s.name = `${s.name}~` },
    'most topics at once (a bulk render)': () => { for (const spec of specs) if (random() < 0.6) spec.produced = (typeof spec.produced === 'bigint' ? 0 : spec.produced ?? 0) + 1 },
    'a new topic in the middle': () => { specs.splice(pickIndex(specs.length), 0, { name: `chunky.${pickIndex(300)}.new${pickIndex(1e6)}`, produced: 1 }) },
    'a topic removed': () => { specs.splice(pickIndex(specs.length), 1) },
    'a topic whose name collides with another\'s label': (s) => { specs.push({ ...s, name: s.name.replace('.', ' '), groups: [] }) },
    // Last: a chunk with a bigint renders afresh at every scrape (see numeric() in lib/exposition/gzip-job.ts).
    'a counter above 2^53 (a bigint)': (s) => { s.produced = 2n ** 53n + BigInt(pickIndex(1000)) },
  }
  const renderer = new Renderer()
  let mismatches = 0
  let rounds = 0
  const check = (what) => {
    rounds++
    const snapshot = build()
    const got = zlib.gunzipSync(renderer.renderGzip(snapshot)) // bulk or chunks: either way exact
    const expected = new Renderer().render(snapshot)
    if (!got.equals(expected)) {
      mismatches++
      if (mismatches <= 3) t.equal(got.toString('utf8'), expected.toString('utf8'), `after ${what}: the gzip body is the fresh render`)
    }
  }
  const chunkCount = Math.ceil(specs.length / CHUNK_TOPICS)
  check('the first render')
  t.same(renderer.gzipChunks, { reused: 0, rendered: 0, bulk: chunkCount }, 'the first render: every chunk new, so one plain body (bulk), numbers kept')
  check('nothing')
  t.same(renderer.gzipChunks, { reused: 0, rendered: chunkCount, bulk: chunkCount }, 'unchanged since: every chunk compressed')
  check('nothing, again')
  t.same(renderer.gzipChunks, { reused: chunkCount, rendered: chunkCount, bulk: chunkCount }, 'unchanged again: every chunk reused')
  for (let round = 0; round < 12; round++) {
    for (const [what, change] of Object.entries(changes)) {
      const counts = { ...renderer.gzipChunks }
      // A topic that has groups and partitions to change (added and colliding ones may not).
      const full = specs.filter((spec) => spec.groups?.length > 0 && Object.keys(spec.partitions ?? {}).length > 0)
      change(full[pickIndex(full.length)])
      check(what)
      if (round === 0 && !/topic|bigint/.test(what)) {
        // One topic changed: its chunk is rendered again, all the others are reused.
        t.equal(renderer.gzipChunks.rendered - counts.rendered, 1, `${what}: exactly one chunk rendered again`)
      }
    }
  }
  t.equal(mismatches, 0, `${rounds} gzip renders after single changes of every kind equal fresh plain renders`)
})

t.test('gzip renders advanced in slices, interleaved across snapshots, each give their own moment', async (t) => {
  // If this failed, a job could pick up a chunk another job had just put in the cache (from a
  // newer snapshot) instead of the one it had found current: a body mixing two moments.
  const sliceKeys = Array.from({ length: 4 * CHUNK_TOPICS }, () => ({}))
  const topics = (last) => sliceKeys.map((key, i) => ({
    ...topicOf(`slices.${String(i).padStart(3, '0')}`, { produced: i === sliceKeys.length - 1 ? last : i, partitions: { 0: i, 1: 2 * i }, groups: [{ name: 'g', floors: { 0: i } }] }),
    key,
  }))
  const a = snapshotOf({ topics: topics(100) })
  const b = snapshotOf({ topics: topics(200) }) // differs from a in the last chunk only
  const renderer = new Renderer()
  renderer.renderGzip(a) // bulk: numbers kept
  renderer.renderGzip(a) // compressed: the cache holds a's chunks
  const jobA = renderer.beginGzip(a)
  const jobB = renderer.beginGzip(b)
  let steps = 0
  let doneA = false
  let doneB = false
  while (!(doneA && doneB)) {
    if (!doneB) doneB = jobB.step(0) // b replaces the last chunk in the cache before …
    if (!doneA) doneA = jobA.step(0) // … a, which found a's version of it current, gets there
    steps++
  }
  t.ok(steps > 2, `both jobs yielded between chunks (${steps} steps)`)
  t.ok(jobA.result().gzip !== undefined && jobB.result().gzip !== undefined, 'both jobs built from chunks (no bulk render)')
  t.ok(zlib.gunzipSync(jobA.result().gzip).equals(new Renderer().render(a)), 'the first job\'s body is its own snapshot')
  t.ok(zlib.gunzipSync(jobB.result().gzip).equals(new Renderer().render(b)), 'the second job\'s body is its own snapshot')
  t.throws(() => renderer.beginGzip(a).result(), /not complete/, 'an unfinished gzip job has no result to hand out')
})

t.test('a gzip render where most chunks changed is one plain body, exact, and its chunks are compressed once they settle', async (t) => {
  // If this failed, a busy broker (most topics moving between scrapes) would get a wrong body from
  // the bulk path, or never get back to reusing chunks once it calms down.
  const keys = Array.from({ length: 8 * CHUNK_TOPICS }, () => ({}))
  const build = (bump) => snapshotOf({
    topics: keys.map((key, i) => ({ ...topicOf(`bulk.${String(i).padStart(3, '0')}`, { produced: i + (i % 2 ? bump : 0), partitions: { 0: i } }), key })),
  })
  const renderer = new Renderer()
  renderer.renderGzip(build(0))
  renderer.renderGzip(build(0))
  const job = renderer.beginGzip(build(1)) // every chunk has a changed topic
  while (!job.step(Infinity));
  const { plain, gzip } = job.result()
  t.equal(gzip, undefined, 'no gzip member built from chunks')
  t.ok(plain.equals(new Renderer().render(build(1))), 'the plain body is exactly the render, for the caller to compress')
  const counts = { ...renderer.gzipChunks }
  t.ok(zlib.gunzipSync(renderer.renderGzip(build(1))).equals(new Renderer().render(build(1))), 'the same numbers again: exact')
  t.equal(renderer.gzipChunks.rendered - counts.rendered, 8, 'and every chunk is compressed, now that it held still')
})

t.test('GET /metrics with gzip, rendered in slices, is one moment\'s numbers', async (t) => {
  // The gzip twin of the torn-scrape test above: recording and removing topics between the slices
  // of a gzip scrape (while chunks are being reused) never leaks into its body.
  const { surface, handles } = tornSurface(t, 'gz', 10 * CHUNK_TOPICS)
  const get = (headers) => new Promise((resolve, reject) => {
    const seen = {}
    const res = {
      statusCode: 0, headersSent: false, destroyed: false,
      setHeader(name, value) { seen[name.toLowerCase()] = value },
      end: (chunk) => resolve({ headers: seen, body: chunk }),
    }
    if (!surface.handler({ url: '/metrics', method: 'GET', headers }, res)) reject(new Error('not handled'))
  })
  const warm = await get({ 'accept-encoding': 'gzip' })
  t.equal(warm.headers['content-encoding'], 'gzip', 'a client that accepts gzip gets gzip')
  t.equal(warm.headers['content-length'], warm.body.length, 'Content-Length is the compressed length')
  t.equal(withoutUptime(zlib.gunzipSync(warm.body).toString('utf8')), withoutUptime(surface.render()), 'it gunzips to the exposition')
  await get({ 'accept-encoding': 'gzip' }) // every chunk compressed: the scrape below reuses them
  handles[5].produced(0, 11, 100) // one chunk changes
  const { answer, before, slicesSeen } = await scrapeWhileMeddling(t, surface, handles, { 'accept-encoding': 'gzip' }, 11)
  t.ok(slicesSeen > 3, `the state changed between slices (${slicesSeen} times before the body was complete)`)
  t.equal(answer.headers['content-encoding'], 'gzip', 'gzip again')
  t.equal(withoutUptime(zlib.gunzipSync(answer.body).toString('utf8')), withoutUptime(before), 'the gzip body is the state at the start of the scrape')
  const plain = await get({})
  t.equal(plain.headers['content-encoding'], undefined, 'without Accept-Encoding: the plain body')
  t.equal(withoutUptime(plain.body.toString('utf8')), withoutUptime(surface.render()), 'which is the exposition')
})

t.test('writeDigits prints every safe integer it is given exactly as String() does', async (t) => {
  const out = Buffer.alloc(40, 0x78)
  const wrong = []
  const check = (n) => {
    const end = writeDigits(out, 5, n)
    const text = out.toString('latin1', 5, end)
    if (text !== String(n) && wrong.length < 5) wrong.push(`${n} → ${text}`)
    if (out[4] !== 0x78 || out[end] !== 0x78) wrong.push(`${n}: wrote outside its digits`)
    out.fill(0x78)
  }
  for (let n = 0; n < 1_100_000; n++) check(n)
  for (let power = 10; power <= 1e15; power *= 10) for (const d of [-1, 0, 1]) check(power + d)
  for (let k = 20; k <= 53; k++) for (const d of [-1, 0, 1]) if (2 ** k + d <= Number.MAX_SAFE_INTEGER) check(2 ** k + d)
  const random = prng(8)
  for (let i = 0; i < 200_000; i++) check(Math.floor(random() * Number.MAX_SAFE_INTEGER))
  for (let i = 0; i < 200_000; i++) check(Math.floor(random() * 2 ** 31))
  t.same(wrong, [])
})

// --- the layout: what a render derives from a snapshot's structure is kept per registry generation

t.test('hasNoCollisions: strictly ascending topic labels, partitions and group labels', async (t) => {
  const { hasNoCollisions } = require('../dist/core/snapshot.js')
  const topic = (label, partitionNumbers = [], groups = []) => ({ label, partitionNumbers, groups: groups.map((g) => ({ label: g })) })
  t.equal(hasNoCollisions([]), true)
  t.equal(hasNoCollisions([topic('a', [0, 1, 5], ['x', 'y']), topic('b'), topic('b_')]), true)
  t.equal(hasNoCollisions([topic('a'), topic('a')]), false, 'two topics, one label')
  t.equal(hasNoCollisions([topic('b'), topic('a')]), false, 'topics out of order')
  t.equal(hasNoCollisions([topic('a', [1, 1])]), false, 'a partition twice')
  t.equal(hasNoCollisions([topic('a', [2, 1])]), false, 'partitions out of order')
  t.equal(hasNoCollisions([topic('a', [], ['g', 'g'])]), false, 'two groups, one label')
  t.equal(hasNoCollisions([topic('a', [], ['h', 'g'])]), false, 'groups out of order')
})

for (const backend of require('./helpers').backends()) {
  t.test(`${backend}: renders that reuse their layout's texts equal the reference through every kind of change`, async (t) => {
    // One surface, one renderer, 400 random steps. Structural steps (a topic, a colliding topic,
    // a group, a colliding group, a partition, a floor on a new partition, a removal) start a new
    // layout; value steps keep it, so the next render reuses the previous render's series texts.
    // A layout that outlived a structural change would render the old topics, groups or
    // partitions: the reference (built from the public snapshot, uncached) would differ.
    const { surfaceOn } = require('./helpers')
    const surface = surfaceOn(t, backend, { max_in_flight: 1_000_000 })
    const random = prng(77)
    const pick = (list) => list[Math.floor(random() * list.length)]
    const names = ['a', 'a.b', 'a_b', 'c', 'd', 'e', 'f', 'g', 'h.']
    const topics = new Map()
    const seqs = new Map()
    const kinds = { structural: 0, value: 0, collisions: 0, collisionFree: 0 }
    const nextSeq = (name, p) => {
      const key = `${name}/${p}`
      seqs.set(key, (seqs.get(key) ?? 0) + 1 + Math.floor(random() * 5))
      return seqs.get(key)
    }
    let mismatches = 0
    // What removed names left in their label's series, kept as the design says (§3.5): a second,
    // naive account of what the registry's carries hold.
    const carries = new Map()
    const carryRemoval = (name) => {
      const topicsNow = surface.snapshot().topics
      const removed = topicsNow.find((x) => x.name === name)
      const others = topicsNow.filter((x) => x.label === removed.label && x !== removed)
      if (others.length === 0) return carries.delete(removed.label)
      const carry = carries.get(removed.label) ?? { produced: 0n, delivered: 0n, dropped: 0n, dlq: 0n, bytes: 0n, lastSeq: new Map(), retries: new Map() }
      carries.set(removed.label, carry)
      for (const k of ['produced', 'delivered', 'dropped', 'dlq', 'bytes']) carry[k] += BigInt(removed[k])
      const held = (p) => others.some((o) => o.partitionNumbers.includes(p))
      const groupHeld = (g) => others.some((o) => o.groups.some((x) => x.label === g))
      for (const p of [...carry.lastSeq.keys()]) if (!held(p)) carry.lastSeq.delete(p)
      for (const g of [...carry.retries.keys()]) if (!groupHeld(g)) carry.retries.delete(g)
      removed.partitionNumbers.forEach((p, i) => { if (held(p)) carry.lastSeq.set(p, Math.max(carry.lastSeq.get(p) ?? 0, removed.lastSeq[i])) })
      for (const g of removed.groups) if (groupHeld(g.label)) carry.retries.set(g.label, (carry.retries.get(g.label) ?? 0n) + BigInt(g.retries))
    }
    for (let step = 0; step < 400; step++) {
      const r = random()
      if (r < 0.12 || topics.size === 0) {
        const name = pick(names)
        if (!topics.has(name)) topics.set(name, { handle: surface.topic(name), groups: new Map() })
        kinds.structural++
      } else if (r < 0.2) {
        const [name, entry] = pick([...topics])
        const group = pick(['g', 'g.1', 'g 1', 'h'])
        if (!entry.groups.has(group)) entry.groups.set(group, entry.handle.group(group))
        kinds.structural++
      } else if (r < 0.26 && topics.size > 1) {
        const [name] = pick([...topics])
        carryRemoval(name)
        surface.removeTopic(name)
        topics.delete(name)
        for (const key of [...seqs.keys()]) if (key.startsWith(`${name}/`)) seqs.delete(key)
        kinds.structural++
      } else {
        const [name, entry] = pick([...topics])
        const p = Math.floor(random() * 6) // a new partition now and then: structural too
        const before = seqs.get(`${name}/${p}`) ?? 0
        const seq = nextSeq(name, p)
        entry.handle.produced(p, seq, 10, seq - before) // seq n is the n-th message: a batch
        const groups = [...entry.groups.values()]
        if (groups.length > 0 && random() < 0.5) pick(groups).ackFloor(p, Math.floor(seqs.get(`${name}/${p}`) / 2))
        kinds.value++
      }
      const rendered = surface.render()
      const snapshot = surface.snapshot()
      if (new Set(snapshot.topics.map((x) => x.label)).size < snapshot.topics.length) kinds.collisions++
      else kinds.collisionFree++
      if (withoutUptime(rendered) !== withoutUptime(reference(snapshot, carries)) && ++mismatches <= 3) {
        t.equal(withoutUptime(rendered), withoutUptime(reference(snapshot, carries)), `step ${step}: the render equals the reference`)
      }
    }
    t.equal(mismatches, 0, `400 steps (${JSON.stringify(kinds)}) render exactly`)
    t.ok(kinds.collisions > 50 && kinds.collisionFree > 100 && kinds.structural > 60 && kinds.value > 200, 'steps of every kind, with and without collisions')
  })

  t.test(`${backend}: a snapshot's layout is one object per generation, and not in the public snapshot`, async (t) => {
    const { surfaceOn } = require('./helpers')
    const surface = surfaceOn(t, backend, { max_in_flight: 100 })
    const { Renderer } = require('../dist/exposition/render.js')
    const seen = []
    const begin = Renderer.prototype.begin
    Renderer.prototype.begin = function (snapshot) {
      seen.push(snapshot.layout)
      return begin.call(this, snapshot)
    }
    t.teardown(() => { Renderer.prototype.begin = begin })
    const topic = surface.topic('x.')
    surface.render()
    topic.produced(0, 1, 1) // a new partition: a new layout
    surface.render()
    topic.produced(0, 2, 1) // numbers only: the same layout
    surface.render()
    surface.topic('x_') // collides with 'x.' once that is sanitized
    surface.render()
    t.equal(seen.length, 4)
    t.not(seen[0], seen[1], 'a partition added: a new layout')
    t.equal(seen[1], seen[2], 'numbers moved: the same layout')
    t.not(seen[2], seen[3], 'a topic added: a new layout')
    t.same(seen.map((layout) => layout.collisionFree), [true, true, true, false])
    t.notOk('layout' in surface.snapshot(), 'surface.snapshot() does not show it')
  })
}

t.test('render() is the /metrics body, byte for byte, whatever the names (the body is ASCII)', async (t) => {
  // render() decodes the body as latin1 (one copy, no validation): exact only while every byte of
  // the exposition is ASCII. Names from any script are sanitized to [A-Za-z0-9_-] (design §3.1).
  const { backends, surfaceOn } = require('./helpers')
  for (const backend of backends()) {
    const surface = surfaceOn(t, backend, { max_in_flight: 100 })
    for (const name of ['zaměstnanci.mzdy', '注文', 'emoji-🚀-topic', 'tab\there', 'quote"and\\back']) {
      const topic = surface.topic(name)
      topic.produced(0, 1, 10)
      topic.group(`grüppe-${name}`).dispatch(1)
    }
    const body = await new Promise((resolve, reject) => {
      const res = { statusCode: 0, headersSent: false, destroyed: false, setHeader() {}, end: resolve }
      if (!surface.handler({ url: '/metrics', method: 'GET', headers: {} }, res)) reject(new Error('not handled'))
    })
    t.ok(body.every((byte) => byte < 0x80), `${backend}: every byte of the body is ASCII`)
    t.equal(withoutUptime(surface.render()), withoutUptime(body.toString('utf8')), `${backend}: render() equals the body decoded as UTF-8`)
  }
})
