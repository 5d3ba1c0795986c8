'use strict'
// Recording threads for the workers and load sections: this file runs as a worker thread (started
// by startWorkers) that attaches to a shared surface and records `produced()` + `delivered()` on
// its own partition of the topics it is given, in runs of n messages or flat out; the main thread
// checks afterwards that every message is in its snapshot, exactly (checkTotals).
const path = require('node:path')
const fs = require('node:fs')
const { isMainThread, Worker, parentPort, workerData } = require('node:worker_threads')
const { performance } = require('node:perf_hooks')
const { DIST } = require('./harness')


function workerMain() {
  const lib = require(path.join(DIST, 'index.js'))
  const { shared, index, topicNames, group, partition } = workerData
  const recorder = lib.attachSurface(shared)
  const topics = topicNames.map((name) => recorder.topic(name))
  const groups = topics.map((topic) => topic.group(group))
  const seqs = topics.map((topic) => topic.lastSeqKnown(partition))
  const dispatched = topics.map(() => 0)
  const delivered = topics.map(() => 0)
  const CHUNK = 1 << 16
  const mask = topics.length - 1 // a power of two

  // Keeps this thread's in_flight share ahead of what it is about to deliver (dispatch is rare).
  function refill(n) {
    for (let k = 0; k < topics.length; k++) {
      const need = delivered[k] + Math.ceil(n / topics.length) + CHUNK - dispatched[k]
      if (need > 0) {
        const amount = need + 10_000_000
        if (!groups[k].dispatch(amount)) throw new Error('bench worker: dispatch refused')
        dispatched[k] += amount
      }
    }
  }

  function record(n) {
    for (let i = 0; i < n; i++) {
      const k = i & mask
      topics[k].produced(partition, ++seqs[k], 100)
      groups[k].delivered()
    }
    for (let k = 0; k < topics.length; k++) delivered[k] += n / topics.length
    return seqs[0]
  }

  // The control: a loop of the same shape with no mq-metrics in it — four adds per message into
  // this thread's own array, nothing shared. How it scales from 1 to 2 threads is what this
  // machine gives two threads at that moment, whatever they run.
  const own = new Float64Array(topics.length * 8)
  function control(n) {
    for (let i = 0; i < n; i++) {
      const k = (i & mask) << 3
      own[k] += 1
      own[k + 1] += 100
      own[k + 2] = i
      own[k + 3] += 1
    }
    return own[0]
  }

  parentPort.on('message', (message) => {
    if (message.cmd === 'run' || message.cmd === 'control') {
      if (message.cmd === 'run') refill(message.n)
      const start = performance.timeOrigin + performance.now()
      const check = message.cmd === 'run' ? record(message.n) : control(message.n)
      const end = performance.timeOrigin + performance.now()
      parentPort.postMessage({ index, start, end, n: message.n, check })
    } else if (message.cmd === 'flat') {
      // Flat out until progress[0] is 1 (2: paused); progress[1 + index] counts CHUNKs done.
      const progress = new Int32Array(message.progress)
      let chunks = 0
      for (let state = 0; state !== 1; state = Atomics.load(progress, 0)) {
        if (state === 2) {
          Atomics.wait(progress, 0, 2, 10) // paused: the main thread measures without us
          continue
        }
        refill(CHUNK)
        record(CHUNK)
        Atomics.store(progress, 1 + index, ++chunks)
      }
      parentPort.postMessage({ index, chunks, chunk: CHUNK })
    } else if (message.cmd === 'state') {
      parentPort.postMessage({ index, seqs: [...seqs], dispatched: [...dispatched], delivered: [...delivered] })
    } else if (message.cmd === 'exit') {
      process.exit(0)
    }
  })
  let tid
  try {
    tid = Number(fs.readlinkSync('/proc/thread-self').split('/').pop()) // "PID/task/TID" (Linux)
  } catch {}
  parentPort.postMessage({ index, ready: true, tid })
}

async function startWorkers(shared, topicNames, group, partitions) {
  const workers = partitions.map((partition, index) => new Worker(__filename, { workerData: { benchRecorder: true, shared, index, topicNames, group, partition } }))
  await Promise.all(workers.map((worker) => new Promise((resolve, reject) => {
    worker.once('error', reject)
    worker.once('message', (m) => {
      worker.tid = m.tid
      m.ready ? resolve() : reject(new Error('bench worker did not start'))
    })
  })))
  for (const worker of workers) worker.on('error', (error) => { console.error('bench worker failed:', error); process.exit(1) })
  return workers
}

function request(worker, message, accept) {
  return new Promise((resolve) => {
    const onMessage = (m) => {
      if (!accept(m)) return
      worker.off('message', onMessage)
      resolve(m)
    }
    worker.on('message', onMessage)
    worker.postMessage(message)
  })
}

async function stopWorkers(workers) {
  await Promise.all(workers.map((worker) => new Promise((resolve) => {
    worker.once('exit', resolve)
    worker.postMessage({ cmd: 'exit' })
  })))
}

/** Every message a worker recorded is in the main thread's snapshot, exactly. */
async function checkTotals(surface, workers, topicNames, group, partitions, base = new Map()) {
  const states = await Promise.all(workers.map((w) => request(w, { cmd: 'state' }, (m) => m.seqs !== undefined)))
  const snapshot = surface.snapshot()
  const problems = []
  topicNames.forEach((name, k) => {
    const topic = snapshot.topics.find((t) => t.name === name)
    const g = topic.groups.find((x) => x.name === group)
    const start = base.get(name) ?? { produced: 0, bytes: 0, delivered: 0, inFlight: 0, seqs: partitions.map(() => 0) }
    let produced = start.produced
    let deliveredTotal = start.delivered
    let inFlight = start.inFlight
    states.forEach((state, w) => {
      produced += state.seqs[k] - start.seqs[w]
      deliveredTotal += state.delivered[k]
      inFlight += state.dispatched[k] - state.delivered[k]
      const partition = topic.partitions.find((p) => p.partition === partitions[w])
      if (partition.lastSeq !== state.seqs[k]) problems.push(`${name} partition ${partitions[w]}: last_seq ${partition.lastSeq} ≠ ${state.seqs[k]}`)
    })
    const bytes = start.bytes + (produced - start.produced) * 100
    if (topic.produced !== produced) problems.push(`${name}: produced ${topic.produced} ≠ ${produced}`)
    if (topic.bytes !== bytes) problems.push(`${name}: bytes ${topic.bytes} ≠ ${bytes}`)
    if (g.delivered !== deliveredTotal) problems.push(`${name}: delivered ${g.delivered} ≠ ${deliveredTotal}`)
    if (g.inFlight !== inFlight) problems.push(`${name}: in_flight ${g.inFlight} ≠ ${inFlight}`)
  })
  if (problems.length) throw new Error(`bench: totals differ after the worker run:\n  ${problems.join('\n  ')}`)
  const produced = topicNames.reduce((sum, name) => sum + snapshot.topics.find((t) => t.name === name).produced, 0)
  return { ok: true, messagesChecked: produced }
}

if (!isMainThread && workerData?.benchRecorder) workerMain()

module.exports = { startWorkers, request, stopWorkers, checkTotals }
