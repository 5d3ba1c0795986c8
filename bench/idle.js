'use strict'
// What an idle broker pays for its metrics: CPU per second of wall-clock time of a process that
// holds a surface (1,000 topics of 4 partitions, 2 groups each) and does nothing, against the same
// process without one, and one holding prom-client's registry of the same series. Each candidate
// is a child process that settles for 0.5 s, then reports its own CPU time (process.cpuUsage,
// every thread) over the next `--seconds`; rounds run the candidates one after another, in turn,
// and the medians are printed.
//
//   node bench/idle.js [--rounds 5] [--seconds 3]
const path = require('node:path')
const { fork } = require('node:child_process')

const { flag } = require('./harness')
const argv = process.argv.slice(2)
const ROUNDS = flag('--rounds', 5)
const SECONDS = flag('--seconds', 3)
const TOPICS = 1000

const CANDIDATES = {
  'node alone': () => {},
  'mq-metrics': () => populate(require(path.join(__dirname, '..', 'dist')).createSurface()),
  'mq-metrics, 2 workers attached': () => {
    const { Worker } = require('node:worker_threads')
    const surface = populate(require(path.join(__dirname, '..', 'dist')).createSurface())
    const source = `const { workerData } = require('node:worker_threads')
      require(${JSON.stringify(path.join(__dirname, '..', 'dist'))}).attachSurface(workerData).topic('t0').append(0, 10)
      setInterval(() => {}, 1 << 30)` // idle, but alive
    for (let i = 0; i < 2; i++) new Worker(source, { eval: true, workerData: surface.share() }).unref()
  },
  'prom-client': () => {
    const client = require('prom-client')
    const registry = new client.Registry()
    const lastSeq = new client.Gauge({ name: 'mq_partition_last_seq', help: 'h', labelNames: ['topic', 'partition'], registers: [registry] })
    const floor = new client.Gauge({ name: 'mq_group_ack_floor', help: 'h', labelNames: ['topic', 'group', 'partition'], registers: [registry] })
    for (let i = 0; i < TOPICS; i++) {
      for (let p = 0; p < 4; p++) {
        lastSeq.set({ topic: `t${i}`, partition: String(p) }, 1)
        for (const g of ['g0', 'g1']) floor.set({ topic: `t${i}`, group: g, partition: String(p) }, 1)
      }
    }
  },
}

function populate(surface) {
  for (let i = 0; i < TOPICS; i++) {
    const topic = surface.topic(`t${i}`)
    for (let p = 0; p < 4; p++) topic.produced(p, 1, 10)
    for (const name of ['g0', 'g1']) {
      const group = topic.group(name)
      for (let p = 0; p < 4; p++) group.ackFloor(p, 1)
    }
  }
  return surface
}

if (process.env.IDLE_CANDIDATE) {
  CANDIDATES[process.env.IDLE_CANDIDATE]()
  const keep = setInterval(() => {}, 1 << 30) // the process stays; nothing else of ours runs
  setTimeout(() => {
    const start = process.cpuUsage()
    const began = process.hrtime.bigint()
    setTimeout(() => {
      const used = process.cpuUsage(start)
      const seconds = Number(process.hrtime.bigint() - began) / 1e9
      process.send({ msPerSecond: (used.user + used.system) / 1000 / seconds })
      clearInterval(keep)
      process.exit(0)
    }, SECONDS * 1000)
  }, 500)
} else {
  main()
}

async function main() {
  const samples = Object.fromEntries(Object.keys(CANDIDATES).map((name) => [name, []]))
  for (let round = 0; round < ROUNDS; round++) {
    for (const name of Object.keys(CANDIDATES)) {
      const child = fork(__filename, argv, { env: { ...process.env, IDLE_CANDIDATE: name } })
      const { msPerSecond } = await new Promise((resolve, reject) => {
        child.once('message', resolve)
        child.once('exit', (code) => reject(new Error(`${name}: exited with ${code} before reporting`)))
      })
      samples[name].push(msPerSecond)
      await new Promise((resolve) => (child.exitCode === null ? child.once('exit', resolve) : resolve()))
    }
  }
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1] }
  const alone = median(samples['node alone'])
  console.log(`CPU of an idle process, ms per second of wall-clock time (median of ${ROUNDS} rounds of ${SECONDS} s; ${TOPICS} topics × 4 partitions, 2 groups):`)
  for (const [name, xs] of Object.entries(samples)) {
    const m = median(xs)
    console.log(`  ${name.padEnd(32)} ${m.toFixed(2).padStart(6)} ms/s   ${name === 'node alone' ? '' : `${m - alone < 0 ? '' : '+'}${(m - alone).toFixed(2)} over node alone   `}rounds ${xs.map((x) => x.toFixed(2)).join(' ')}`)
  }
}
