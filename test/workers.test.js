'use strict'
// SPEC §11: recording from worker threads lands in the same numbers, with no lost update.
const t = require('tap')
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const { backends, surfaceOn, faultsOf } = require('./helpers')

const WORKER = path.join(__dirname, 'fixtures', 'recording-worker.js')

function run(shared, id, n, mode) {
  return new Promise((resolve, reject) => {
    const worker = new Worker(WORKER, { workerData: { shared, id, n, mode } })
    let message
    worker.on('message', (m) => (message = m))
    worker.on('error', (error) => (mode === 'throw' ? null : reject(error)))
    worker.on('exit', () => resolve(message))
  })
}

for (const backend of backends()) {
  t.test(`${backend}: main + 2 workers × 1,000,000 produced()/delivered() → exact totals`, async (t) => {
    const surface = surfaceOn(t, backend, { max_in_flight: 2 ** 31 - 1 })
    const faults = faultsOf(surface)
    const shared = surface.share()
    const N = 1_000_000
    const topic = surface.topic('shared-topic')
    const group = topic.group('g')
    group.dispatch(3 * N)
    const workers = [run(shared, 1, N), run(shared, 2, N)]
    for (let i = 1; i <= N; i++) {
      topic.produced(0, i, 3)
      group.delivered(1)
    }
    const results = await Promise.all(workers)
    t.same(results.map((r) => r.backend), [backend, backend], 'workers map the same backend')
    const snapshot = surface.snapshot()
    const s = snapshot.topics.find((x) => x.name === 'shared-topic')
    t.equal(s.produced, 3 * N, 'no produced() may be lost across threads')
    t.equal(s.bytes, 9 * N)
    t.equal(s.delivered, 3 * N, 'no delivered() may be lost across threads')
    t.equal(s.groups[0].inFlight, 0, 'in_flight is exact across threads')
    t.same(s.partitions.map((p) => [p.partition, p.lastSeq]), [[0, N], [1, N], [2, N]])
    t.same(snapshot.topics.map((x) => x.name).filter((n) => n.startsWith('from-worker')), ['from-worker-1', 'from-worker-2'],
      'a topic registered inside a worker is visible from the main thread')
    t.same(faults, [], 'no faults on honest traffic')
  })

  t.test(`${backend}: a worker that throws mid-recording loses nothing it recorded`, async (t) => {
    const surface = surfaceOn(t, backend, { max_in_flight: 2 ** 31 - 1 })
    const shared = surface.share()
    surface.topic('shared-topic').group('g').dispatch(100_000)
    await run(shared, 1, 100_000, 'throw')
    const s = surface.snapshot().topics.find((x) => x.name === 'shared-topic')
    t.equal(s.produced, 50_000, 'everything recorded before the throw is kept')
    t.equal(s.delivered, 50_000)
  })

  t.test(`${backend}: faults raised in a worker reach the main thread's log and events`, async (t) => {
    const surface = surfaceOn(t, backend)
    const faults = faultsOf(surface)
    const shared = surface.share()
    await new Promise((resolve, reject) => {
      const worker = new Worker(`
        const { workerData } = require('node:worker_threads')
        const { attachSurface } = require(${JSON.stringify(path.join(__dirname, '..', 'dist'))})
        const g = attachSurface(workerData).topic('w').group('g')
        g.deadLettered(1)
      `, { eval: true, workerData: shared })
      worker.on('error', reject)
      worker.on('exit', resolve)
    })
    surface.snapshot()
    t.match(faults, [{ code: 'DLQ_WITHOUT_DROP', labels: { topic: 'w', group: 'g' } }])
    t.equal(surface.stats('faults').counts.DLQ_WITHOUT_DROP, 1)
  })
}

t.test('attachSurface refuses anything but a share() result', async (t) => {
  const { lib } = require('./helpers')
  t.throws(() => lib.attachSurface({}), TypeError)
  t.throws(() => lib.attachSurface(null), TypeError)
})
