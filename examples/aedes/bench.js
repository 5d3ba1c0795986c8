'use strict'
// Broker CPU per delivery, aedes alone against aedes + mq-metrics (instrument.js), in interleaved
// rounds: a child process runs the broker (INSTRUMENT=0|1) and reports its own CPU time; this
// process drives it with mqtt.js (2 publishers × QoS 1 with `window` publishes each awaiting their
// PUBACK, 4 subscribers on 4 topics) and, as Prometheus would, scrapes the instrumented broker's
// /metrics (served by the library's scrape thread) when it starts and every `scrape` seconds.
//   node bench.js [--rounds 21] [--messages 40000] [--window 16] [--scrape 15]
//   node bench.js --together [--rounds 21] [--seconds 4] [--arms alone,library]   two brokers at
//     once, each with its own clients, measured over the same wall-clock window: the machine's slow
//     phases hit both alike. An arm is `alone` (aedes), `library` (aedes + instrument.js + mq-metrics)
//     or `stand-in` (instrument.js over a stand-in surface whose calls do no counting): alone against
//     stand-in is the glue's own cost, stand-in against library the library's; `unscraped` is
//     `library` with no /metrics served (no scrape thread), as the runs before 2026-11-27 measured
//   node bench.js --profile [--messages 40000]   one instrumented round under V8's CPU profiler: the
//     share of the broker's busy CPU spent in mq-metrics' frames and in instrument.js' (each frame's
//     own time), a measure taken within one run, so the machine's drift between rounds cannot move it
const { fork } = require('node:child_process')
const mqtt = require('mqtt')
const arg = (name, fallback) => { const at = process.argv.indexOf(`--${name}`); return at === -1 ? fallback : Number(process.argv[at + 1]) }
const ROUNDS = arg('rounds', 21)
const MESSAGES = arg('messages', 40000)
const WINDOW = arg('window', 16)
const SCRAPE = arg('scrape', 15)
const TOPICS = ['orders', 'billing', 'audit', 'alerts']

if (process.env.BENCH_CHILD) {
  const net = require('node:net')
  const broker = require('aedes')()
  let metrics = Promise.resolve(undefined)
  if (process.env.INSTRUMENT === 'library' || process.env.INSTRUMENT === 'unscraped') {
    const surface = require('mq-metrics').createSurface()
    require('./instrument').instrument(broker, surface)
    if (process.env.INSTRUMENT === 'library') metrics = surface.listen({ port: 0, host: '127.0.0.1' }).then((listening) => listening.port)
  }
  if (process.env.INSTRUMENT === 'stand-in') require('./instrument').instrument(broker, standIn())
  const server = net.createServer(broker.handle).listen(0, '127.0.0.1', () => metrics.then((metricsPort) => process.send({ port: server.address().port, metricsPort })))
  process.on('message', (m) => { if (m === 'cpu') process.send({ cpu: process.cpuUsage() }); else if (m === 'exit') process.exit(0) })
} else if (process.argv.includes('--profile')) {
  profile()
} else if (process.argv.includes('--together')) {
  together()
} else {
  main()
}

/** A broker in a child process, its 4 subscribers (on every topic) and 2 publishers connected. */
async function broker(arm, execArgv = []) {
  const child = fork(__filename, [], { execArgv, env: { ...process.env, BENCH_CHILD: '1', INSTRUMENT: arm } })
  const { port, metricsPort } = await new Promise((resolve) => child.once('message', resolve))
  const connect = (id) => new Promise((resolve) => { const c = mqtt.connect(`mqtt://127.0.0.1:${port}`, { clientId: id }); c.once('connect', () => resolve(c)) })
  const b = { subs: await Promise.all([0, 1, 2, 3].map((i) => connect(`s${i}`))), received: 0 }
  for (const s of b.subs) { await s.subscribeAsync(TOPICS, { qos: 1 }); s.on('message', () => b.received++) }
  b.pubs = await Promise.all([connect('p0'), connect('p1')])
  b.cpuNow = () => new Promise((resolve) => { child.once('message', (m) => resolve(m.cpu)); child.send('cpu') })
  // Prometheus: a scrape now (the library's scrape thread starts and claims its row), then every
  // SCRAPE s, each on a connection of its own. A connection kept alive (Node's default agent) and
  // left idle costs aedes ~2% more CPU per delivery for as long as it stays open (5 s: the
  // server's keep-alive timeout), mq-metrics' or not: a plain node:http server with no mq-metrics
  // measured +2.1% (examples/aedes/README.md). Prometheus scraping every 15 s holds one open for
  // 5 s in 15; the bench would keep it open through the whole 4 s window.
  const scrape = () => new Promise((resolve, reject) => require('node:http').get(`http://127.0.0.1:${metricsPort}/metrics`, { agent: false }, (res) => res.resume().on('end', resolve)).on('error', reject))
  if (metricsPort !== undefined) await scrape()
  const scraping = metricsPort === undefined ? undefined : setInterval(scrape, SCRAPE * 1000)
  b.close = async () => {
    clearInterval(scraping)
    for (const c of [...b.subs, ...b.pubs]) c.end(true)
    await new Promise((resolve) => { child.once('exit', resolve); child.send('exit') }) // exits cleanly: a profile is written
  }
  return b
}

async function round(instrument, execArgv = []) {
  const b = await broker(instrument ? 'library' : 'alone', execArgv)
  const { subs, pubs, cpuNow } = b
  // Each publisher keeps WINDOW publishes awaiting their PUBACK, as a busy device fleet does.
  const publishAll = async (messages) => {
    let next = 0
    const expected = b.received + messages * subs.length
    const lane = async (p) => { for (let i; (i = next++) < messages;) await p.publishAsync(TOPICS[i % 4], 'x'.repeat(64), { qos: 1 }) }
    await Promise.all(pubs.flatMap((p) => Array.from({ length: WINDOW }, () => lane(p))))
    const end = Date.now() + 30_000
    while (b.received < expected && Date.now() < end) await new Promise((r) => setTimeout(r, 5))
  }
  await publishAll(MESSAGES / 4) // warm-up: the JIT and the heap settle, groups and series exist
  const before = b.received
  const cpu = await cpuNow()
  const started = process.hrtime.bigint()
  await publishAll(MESSAGES)
  const seconds = Number(process.hrtime.bigint() - started) / 1e9
  const after = await cpuNow()
  const delivered = b.received - before
  await b.close()
  const us = after.user + after.system - cpu.user - cpu.system
  return { usPerDelivery: us / delivered, deliveriesPerSecond: delivered / seconds }
}

async function main() {
  const rows = { plain: [], instrumented: [] }
  for (let r = 0; r < ROUNDS; r++) {
    for (const instrument of r % 2 ? [true, false] : [false, true]) rows[instrument ? 'instrumented' : 'plain'].push(await round(instrument))
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
  const plain = median(rows.plain.map((x) => x.usPerDelivery))
  const inst = median(rows.instrumented.map((x) => x.usPerDelivery))
  console.log(`broker CPU per delivery, median of ${ROUNDS} interleaved rounds of ${MESSAGES} publishes × 4 subscribers:`)
  console.log(`  aedes alone        ${plain.toFixed(2)} µs   ${median(rows.plain.map((x) => x.deliveriesPerSecond)).toFixed(0)} deliveries/s`)
  console.log(`  aedes + mq-metrics ${inst.toFixed(2)} µs   ${median(rows.instrumented.map((x) => x.deliveriesPerSecond)).toFixed(0)} deliveries/s`)
  // Each round runs both back to back: the ratio within a round is immune to the machine's drift.
  const ratios = rows.plain.map((x, r) => rows.instrumented[r].usPerDelivery / x.usPerDelivery)
  console.log(`  overhead           ${(((inst - plain) / plain) * 100).toFixed(1)}% of the medians; ${((median(ratios) - 1) * 100).toFixed(1)}% the median of each round's ratio (goal ≤ 5%), ${interval(ratios)}`)
  console.log(`  rounds (µs)        alone ${rows.plain.map((x) => x.usPerDelivery.toFixed(2)).join(' ')} | with ${rows.instrumented.map((x) => x.usPerDelivery.toFixed(2)).join(' ')}`)
}

/** Self time per frame of one instrumented round's CPU profile, by whose code the frame runs. */
async function profile() {
  const fs = require('node:fs')
  const path = require('node:path')
  const dir = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'mq-aedes-profile-'))
  await round(true, ['--cpu-prof', '--cpu-prof-dir', dir, '--cpu-prof-interval', '200'])
  const { nodes, samples, timeDeltas } = JSON.parse(fs.readFileSync(path.join(dir, fs.readdirSync(dir)[0]), 'utf8'))
  fs.rmSync(dir, { recursive: true })
  const library = path.dirname(require.resolve('mq-metrics'))
  const whose = new Map(nodes.map((n) => [n.id, n.callFrame.functionName === '(idle)' ? 'idle' : n.callFrame.url.includes(library) ? 'library' : n.callFrame.url.endsWith('instrument.js') ? 'glue' : 'broker']))
  const us = { idle: 0, library: 0, glue: 0, broker: 0 }
  samples.forEach((id, i) => (us[whose.get(id)] += timeDeltas[i]))
  const busy = us.library + us.glue + us.broker
  const pct = (x) => `${((x / busy) * 100).toFixed(1)}%`
  console.log(`one instrumented round of ${MESSAGES} publishes × 4 subscribers under the CPU profiler (start-up included), shares of the broker's busy CPU:`)
  console.log(`  mq-metrics ${pct(us.library)}   instrument.js ${pct(us.glue)}   together ${pct(us.library + us.glue)}: +${(((us.library + us.glue) / us.broker) * 100).toFixed(1)}% over the rest`)
}

/** A broker (child process) under continuous load until stopped: its CPU and deliveries so far. */
async function loaded(arm) {
  const b = await broker(arm)
  let stopped = false
  let next = 0
  const lane = async (p) => { while (!stopped) await p.publishAsync(TOPICS[next++ % 4], 'x'.repeat(64), { qos: 1 }) }
  const lanes = Promise.all(b.pubs.flatMap((p) => Array.from({ length: WINDOW }, () => lane(p))))
  return {
    now: async () => { const cpu = await b.cpuNow(); return { us: cpu.user + cpu.system, received: b.received } },
    stop: async () => {
      stopped = true
      await lanes
      await b.close()
    },
  }
}

async function together() {
  const SECONDS = arg('seconds', 4)
  const at = process.argv.indexOf('--arms')
  const arms = at === -1 ? ['alone', 'library'] : String(process.argv[at + 1]).split(',')
  const ARMS = ['alone', 'stand-in', 'library', 'unscraped']
  if (arms.length !== 2 || !arms.every((a) => ARMS.includes(a)) || arms[0] === arms[1]) throw new Error(`--arms takes two of ${ARMS.join(', ')}, got ${process.argv[at + 1]}`)
  const ratios = []
  const rows = [[], []]
  for (let r = 0; r < ROUNDS; r++) {
    const brokers = r % 2 ? (await Promise.all([loaded(arms[1]), loaded(arms[0])])).reverse() : await Promise.all(arms.map(loaded)) // each starts first in turn
    await new Promise((resolve) => setTimeout(resolve, 1000)) // warm-up: the JIT and the heap settle
    const before = await Promise.all(brokers.map((b) => b.now()))
    await new Promise((resolve) => setTimeout(resolve, SECONDS * 1000))
    const after = await Promise.all(brokers.map((b) => b.now()))
    await Promise.all(brokers.map((b) => b.stop()))
    const [first, second] = [0, 1].map((k) => (after[k].us - before[k].us) / (after[k].received - before[k].received))
    rows[0].push(first)
    rows[1].push(second)
    ratios.push(second / first)
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
  const name = { alone: 'aedes alone', 'stand-in': 'aedes + instrument.js over a stand-in', library: 'aedes + mq-metrics', unscraped: 'aedes + mq-metrics, /metrics not served' }
  console.log(`broker CPU per delivery, ${ROUNDS} rounds of ${SECONDS} s with both brokers loaded at once (each its own clients):`)
  console.log(`  ${name[arms[0]]} ${median(rows[0]).toFixed(2)} µs   ${name[arms[1]]} ${median(rows[1]).toFixed(2)} µs`)
  const goal = arms[0] === 'alone' && arms[1] === 'library' ? ' (goal ≤ 5%)' : ''
  console.log(`  overhead    ${((median(ratios) - 1) * 100).toFixed(1)}% the median of each round's ratio${goal}, ${interval(ratios)}; ratios ${ratios.map((x) => ((x - 1) * 100).toFixed(1)).join(' ')}`)
}

/**
 * A surface whose handles count nothing: each call returns what the glue needs to go on as it
 * would with the library (append() numbers messages, floor() follows settlements made in order).
 */
function standIn() {
  const group = () => {
    let floor = 0
    const settled = (seq) => { if (seq === floor + 1) floor = seq; return true }
    return { floor: () => floor, inFlight: () => 0, isInFlight: () => false, isSettled: (_, seq) => seq <= floor, send: () => true, redeliver: () => true, settle: (_, seq) => settled(seq), settleUpTo: (_, seq) => { floor = Math.max(floor, seq); return 1 } }
  }
  const topic = () => {
    let last = 0
    return { lastSeq: () => last, append: () => ++last, group, removeGroup: () => {} }
  }
  return { config: { max_topics: 10000 }, topic, removeTopic: () => {} }
}

/**
 * A confidence interval for the median of the rounds' ratios that assumes nothing about their
 * distribution: the k-th smallest and k-th largest ratio, k as large as keeps the chance that
 * the true median lies outside below 5% (each ratio falls below the median with probability ½).
 */
function interval(ratios) {
  const xs = [...ratios].sort((a, b) => a - b)
  const n = xs.length
  let k = 0
  for (let below = 0, choose = 1, i = 0; i < n; choose = (choose * (n - i)) / (i + 1), i++) {
    below += choose / 2 ** n // P(fewer than i + 1 of the n ratios fall below the median)
    if (below > 0.025) break
    k = i + 1
  }
  if (k === 0) return `too few rounds for a 95% interval (${n})`
  const pct = (x) => `${((x - 1) * 100).toFixed(1)}%`
  let outside = 0
  for (let i = 0, choose = 1; i < k; choose = (choose * (n - i)) / (i + 1), i++) outside += (2 * choose) / 2 ** n
  return `${((1 - outside) * 100).toFixed(0)}% interval ${pct(xs[k - 1])} to ${pct(xs[n - k])}`
}
