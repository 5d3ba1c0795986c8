'use strict'
// Attaching a worker after a long history: the time attachSurface() and the first
// name lookup take in a worker (which replays the registration log) on a surface that saw
// 1,000,000 topic registrations come and go, against a fresh surface with the same live state.
// Rounds alternate between the two; medians of each are printed, and their ratio.
//
//   node bench/attach.js [--registrations N] [--live L] [--rounds R]
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const { createSurface } = require(path.join(__dirname, '..', 'dist'))

const { flag } = require('./harness')
const REGISTRATIONS = flag('--registrations', 1_000_000)
const LIVE = flag('--live', 1000)
const ROUNDS = flag('--rounds', 9)

/** L live topics of 4 partitions and 2 groups with floors, as a broker's would be. */
function populate(surface, prefix) {
  for (let i = 0; i < LIVE; i++) {
    const topic = surface.topic(`${prefix}${i}`)
    for (let p = 0; p < 4; p++) topic.produced(p, 1, 10)
    for (const name of ['g0', 'g1']) {
      const group = topic.group(name)
      for (let p = 0; p < 4; p++) group.ackFloor(p, 1)
    }
  }
}

function attachTime(shared, name) {
  return new Promise((resolve, reject) => {
    const worker = new Worker(`
      const { workerData, parentPort } = require('node:worker_threads')
      const { attachSurface } = require(${JSON.stringify(path.join(__dirname, '..', 'dist'))})
      const started = process.hrtime.bigint()
      const recorder = attachSurface(workerData.shared)
      recorder.topic(workerData.name).group('g0') // replays the log: the worker now knows every live name
      parentPort.postMessage(Number(process.hrtime.bigint() - started) / 1e6)
    `, { eval: true, workerData: { shared, name }, execArgv: [] })
    worker.once('message', (ms) => worker.terminate().then(() => resolve(ms)))
    worker.once('error', reject)
  })
}

const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]

async function main() {
  const old = createSurface({ max_topics: LIVE + 10 })
  const started = Date.now()
  for (let i = 0; i < REGISTRATIONS - LIVE; i++) {
    const topic = old.topic(`gone-${i}`)
    topic.produced(0, 1, 1)
    old.removeTopic(`gone-${i}`)
    if (i % 4096 === 4095) await new Promise((resolve) => setImmediate(resolve))
  }
  populate(old, 'live-')
  const fresh = createSurface({ max_topics: LIVE + 10 })
  populate(fresh, 'live-')
  console.log(`${REGISTRATIONS.toLocaleString('en')} registrations made in ${((Date.now() - started) / 1000).toFixed(1)} s; log: ${old.arenaUsage().logBytes} B (history) vs ${fresh.arenaUsage().logBytes} B (fresh)`)
  const times = { old: [], fresh: [] }
  for (let round = 0; round < ROUNDS; round++) {
    times.old.push(await attachTime(old.share(), `live-${round}`))
    times.fresh.push(await attachTime(fresh.share(), `live-${round}`))
  }
  const ratio = median(times.old) / median(times.fresh)
  console.log(`attach + first lookup, median of ${ROUNDS} interleaved rounds: after ${REGISTRATIONS.toLocaleString('en')} registrations ${median(times.old).toFixed(2)} ms, fresh with the same ${LIVE} live topics ${median(times.fresh).toFixed(2)} ms: ${ratio.toFixed(2)}× (goal ≤ 2×)`)
  await old.close()
  await fresh.close()
}

main()
