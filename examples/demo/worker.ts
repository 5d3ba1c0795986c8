// The demo's worker thread (design §11, §13): it owns some topics end to end — their producer and
// both consumer groups — and records through `attachSurface(surface.share())`, as a broker that
// spreads partitions over worker_threads would.
//
// The main thread tells this worker whether writes are admitted (a worker may ask its recorder's
// `admitWrite()` too: docs/api.md; the demo fences it instead, to show no refused write). Before
// a replication round that will turn the quorum read_only, the main thread fences the worker
// ({ type: 'writable', value: false } and waits for 'fenced'), so no refused write is ever
// attempted; should one slip through anyway, produced() returns false and the seq stays put.
import { parentPort, workerData } from 'node:worker_threads'
import { SimulatedTopic, addTotals, emptyTotals } from './broker'
import { attachSurface } from 'mq-metrics'
import type { SharedSurface } from 'mq-metrics'

export interface DemoWorkerData {
  shared: SharedSurface
  topics: string[]
  /** Messages per second for each topic. */
  topicRate: number
  partitions: number
  maxAttempts: number
  tickMs: number
  /** Bound on the drain after 'stop', in milliseconds. */
  drainMs: number
}

/** Main → worker. */
export type ToWorker = { type: 'start' } | { type: 'writable'; value: boolean } | { type: 'stop' }
/** Worker → main. */
export type FromWorker =
  | { type: 'ready' }
  | { type: 'fenced' }
  | { type: 'totals'; totals: ReturnType<typeof emptyTotals> }
  | { type: 'drained'; drained: boolean; totals: ReturnType<typeof emptyTotals> }

function main(port: NonNullable<typeof parentPort>, data: DemoWorkerData): void {
  const recorder = attachSurface(data.shared)
  const options = { partitions: data.partitions, maxAttempts: data.maxAttempts, tickMs: data.tickMs }
  const topics = data.topics.map((name) => new SimulatedTopic(recorder, name, options))
  let writable = true
  let producing = false
  let timer: NodeJS.Timeout | undefined
  let drainDeadline = 0

  const totals = () => topics.reduce((sum, topic) => addTotals(sum, topic.totals), emptyTotals())
  const send = (message: FromWorker) => port.postMessage(message)

  const tick = () => {
    const now = performance.now()
    for (const topic of topics) topic.tick(now, data.topicRate, producing, () => writable)
    if (!producing && drainDeadline > 0) {
      const drained = topics.every((topic) => topic.drained())
      if (drained || now >= drainDeadline) {
        clearInterval(timer)
        send({ type: 'drained', drained, totals: totals() })
        port.close()
      }
    }
  }
  // The live summary on the main thread reads these; cheap, once a second.
  const report = setInterval(() => send({ type: 'totals', totals: totals() }), 1000)

  port.on('message', (message: ToWorker) => {
    switch (message.type) {
      case 'start':
        producing = true
        timer = setInterval(tick, data.tickMs)
        break
      case 'writable':
        writable = message.value
        // Ticks run on this thread's event loop: once this handler returns, no produce can run
        // until 'writable' comes back true.
        if (!writable) send({ type: 'fenced' })
        break
      case 'stop':
        producing = false
        clearInterval(report)
        drainDeadline = performance.now() + data.drainMs
        if (timer === undefined) timer = setInterval(tick, data.tickMs)
        break
    }
  })
  // Every handle is resolved (topics, groups, partitions registered) before the main thread
  // takes its first look, so the conservation baselines start from settled books.
  send({ type: 'ready' })
}

if (parentPort !== null) main(parentPort, workerData as DemoWorkerData)
