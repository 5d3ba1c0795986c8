'use strict'
// design §11: recording from worker threads lands in the same numbers, with no lost update.
const t = require('tap')
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const { backends, surfaceOn, faultsOf } = require('./helpers')

const WORKER = path.join(__dirname, 'fixtures', 'recording-worker.js')

function run(shared, id, n, mode) {
  return new Promise((resolve, reject) => {
    const worker = new Worker(WORKER, { workerData: { shared, id, n, mode }, execArgv: [] })
    let message
    worker.on('message', (m) => (message = m))
    worker.on('error', (error) => (mode === 'throw' ? null : reject(error)))
    worker.on('exit', () => resolve(message))
  })
}

for (const backend of backends()) {
  t.test(`${backend}: main + 2 workers × 1,000,000 produced()/delivered() → exact totals`, async (t) => {
    const surface = surfaceOn(t, backend, { max_in_flight: 2 ** 31 - 1 })
    // These threads count deliveries without raising floors (only the totals are under test here),
    // so the group's books do not balance: CONSERVATION_BROKEN is right, and left out.
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN'] })
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
      `, { eval: true, workerData: shared, execArgv: [] })
      worker.on('error', reject)
      worker.on('exit', resolve)
    })
    surface.snapshot()
    t.match(faults, [{ code: 'DLQ_WITHOUT_DROP', labels: { topic: 'w', group: 'g' } }])
    t.equal(surface.stats('faults').counts.DLQ_WITHOUT_DROP, 1)
  })
}

for (const backend of backends()) {
  t.test(`${backend}: a worker asks admitWrite() and sees the tier the main thread sets, at once`, async (t) => {
    const surface = surfaceOn(t, backend)
    const faults = faultsOf(surface)
    const worker = new Worker(`
      const { workerData, parentPort } = require('node:worker_threads')
      const { attachSurface } = require(${JSON.stringify(path.join(__dirname, '..', 'dist'))})
      const recorder = attachSurface(workerData)
      const orders = recorder.topic('orders')
      parentPort.on('message', () => {
        const answer = recorder.admitWrite()
        const seq = answer.ok ? orders.append(0, 10) : 0 // the documented protocol: no append when refused
        parentPort.postMessage({ answer, state: recorder.quorumState, seq })
      })
    `, { eval: true, workerData: surface.share(), execArgv: [] })
    t.teardown(() => worker.terminate())
    const ask = () => new Promise((resolve) => { worker.once('message', resolve); worker.postMessage('go') })
    t.same(await ask(), { answer: { ok: true, durability: 'quorum' }, state: 0, seq: 1 }, 'healthy: admitted, appended')
    surface.replicationRound({ replicas: 3, inSync: 2 })
    t.same(await ask(), { answer: { ok: true, durability: 'quorum', code: 0x6004, name: 'FOLLOWER_LAG' }, state: 1, seq: 2 }, 'soft: admitted with FOLLOWER_LAG, as the main thread answers')
    surface.replicationRound({ replicas: 3, inSync: 1 })
    t.same(await ask(), { answer: { ok: false, code: 0x6002, name: 'READ_ONLY_DEGRADED' }, state: 2, seq: 0 }, 'read_only: refused before any append')
    t.same(surface.admitWrite(), { ok: false, code: 0x6002, name: 'READ_ONLY_DEGRADED' }, 'the same answer as the main thread\'s')
    t.equal(surface.topic('orders').lastSeq(0), 2, 'nothing appended in read_only')
    t.same(faults.map((f) => f.code), [], 'a worker that asks first raises no WRITE_WHILE_READ_ONLY')
    surface.replicationRound({ replicas: 3, inSync: 3 })
    t.same((await ask()).seq, 3, 'healthy again: appended')
  })
}

t.test('attachSurface refuses anything but a share() result', async (t) => {
  const { lib } = require('./helpers')
  t.throws(() => lib.attachSurface({}), TypeError)
  t.throws(() => lib.attachSurface(null), TypeError)
  // A share() altered on its way: checked before anything is attached, so a worker never records
  // under caps other than the surface's, or over memory the surface does not grow.
  const { surfaceOn } = require('./helpers')
  const surface = surfaceOn(t, 'js', { max_topics: 3 })
  const shared = surface.share()
  t.throws(() => lib.attachSurface({ ...shared, config: {} }), { name: 'TypeError', message: /its config lacks metrics_enabled, .*max_groups_per_topic/ })
  t.throws(() => lib.attachSurface({ ...shared, config: { ...shared.config, max_topics: -1 } }), { name: 'TypeError', message: /its config is not a surface's .*max_topics/ })
  t.throws(() => lib.attachSurface({ ...shared, arena: { ...shared.arena, buffer: new SharedArrayBuffer(65536) } }), { name: 'TypeError', message: /not growable/ })
})

// design §5 across threads: a partition written by one thread keeps its last_seq hint to itself
// (no shared write per call); the moment a second thread writes it, both check against the hint.
const STEPPER = `
  const { parentPort, workerData } = require('node:worker_threads')
  const { attachSurface } = require(${JSON.stringify(path.join(__dirname, '..', 'dist'))})
  const topic = attachSurface(workerData).topic('seqs')
  parentPort.on('message', ({ partition, seq, count, exit }) => {
    if (exit) return process.exit(0)
    try {
      topic.produced(partition, seq, 1, count)
      parentPort.postMessage({ ok: true })
    } catch (error) {
      parentPort.postMessage({ ok: false, code: error.code, previous: error.previous })
    }
  })
`

for (const backend of backends()) {
  t.test(`${backend}: last_seq regressions are caught across threads, whichever thread wrote first`, async (t) => {
    const surface = surfaceOn(t, backend)
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN'] }) // an ack floor below without deliveries: not the subject here
    const worker = new Worker(STEPPER, { eval: true, workerData: surface.share(), execArgv: [] })
    t.teardown(() => worker.terminate())
    const inWorker = (partition, seq, count = 1) => new Promise((resolve, reject) => {
      // One listener pair per call, both removed once either fires (else 'error' listeners pile up).
      const onMessage = (m) => { worker.off('error', onError); resolve(m) }
      const onError = (e) => { worker.off('message', onMessage); reject(e) }
      worker.once('message', onMessage)
      worker.once('error', onError)
      worker.postMessage({ partition, seq, count })
    })
    const topic = surface.topic('seqs')
    const lastSeqs = () => Object.fromEntries(surface.snapshot().topics.find((x) => x.name === 'seqs').partitions.map((p) => [p.partition, p.lastSeq]))

    // p0: the worker writes alone, then the main thread goes back in time.
    for (let seq = 1; seq <= 100; seq++) t.same(await inWorker(0, seq), { ok: true })
    t.same(lastSeqs(), { 0: 100 }, 'a partition with a single writer reads back exactly')
    t.equal(topic.lastSeqKnown(0), 100, 'and so does lastSeqKnown from another thread')
    t.throws(() => topic.produced(0, 50, 1), { code: 'SEQ_REGRESSION', previous: 100, attempted: 50 })
    t.same(await inWorker(0, 101), { ok: true }, 'the rejected write changed nothing')
    t.throws(() => topic.produced(0, 100, 1), { code: 'SEQ_REGRESSION', previous: 101 }, 'the owner keeps the hint up to date once shared')

    // p1: the main thread writes first, the worker joins, each then regresses against the other.
    t.equal(topic.produced(1, 10, 1), true)
    t.same(await inWorker(1, 20, 10), { ok: true })
    t.throws(() => topic.produced(1, 15, 1), { code: 'SEQ_REGRESSION', previous: 20 })
    t.same(await inWorker(1, 18), { ok: false, code: 'SEQ_REGRESSION', previous: 20 })
    t.equal(topic.produced(1, 30, 1, 10), true)
    t.same(await inWorker(1, 25), { ok: false, code: 'SEQ_REGRESSION', previous: 30 })

    // p2: only seq 0 so far (empty appends, count 0), from both threads; it must read (and
    // render) as 0, and still catch. A seq-0 message is refused (seqs count from 1).
    t.throws(() => topic.produced(2, 0, 1), { code: 'SEQ_REGRESSION', previous: 0, attempted: 0 })
    t.equal(topic.produced(2, 0, 1, 0), true)
    t.same(await inWorker(2, 0, 0), { ok: true })
    t.equal(topic.produced(2, 0, 1, 0), true)
    t.same(await inWorker(2, 5, 5), { ok: true })
    t.throws(() => topic.produced(2, 3, 1), { code: 'SEQ_REGRESSION', previous: 5 })
    // A repeated seq and an overlapping batch, each from the thread that did not write last.
    t.throws(() => topic.produced(2, 7, 1, 3), { code: 'SEQ_REGRESSION', previous: 5, attempted: 5 })
    t.equal(topic.produced(2, 6, 1), true)
    t.same(await inWorker(2, 6), { ok: false, code: 'SEQ_REGRESSION', previous: 6 })
    t.same(await inWorker(2, 8, 2), { ok: true }, 'a batch right after last_seq is taken')

    // p3: a reader in the main thread (lastSeqKnown, ackFloor) does not take the partition over.
    t.same(await inWorker(3, 7), { ok: true })
    t.equal(topic.lastSeqKnown(3), 7)
    const group = topic.group('g')
    t.equal(group.ackFloor(3, 7), true, 'an ack floor up to the worker-written last_seq is accepted')
    t.equal(group.ackFloor(3, 8), false, 'and one past it is refused')
    t.same(await inWorker(3, 8), { ok: true })
    t.throws(() => topic.produced(3, 7, 1), { code: 'SEQ_REGRESSION', previous: 8 })

    t.same(lastSeqs(), { 0: 101, 1: 30, 2: 8, 3: 8 })
    const text = surface.render().toString()
    for (const [p, seq] of [[0, 101], [1, 30], [2, 8], [3, 8]]) {
      t.match(text, `mq_partition_last_seq{topic="seqs",partition="${p}"} ${seq}\n`)
    }
    t.notMatch(text, /NaN|-0\n/, 'no hint encoding leaks into the exposition')
    surface.snapshot() // brings the worker's faults over
    const counts = {}
    for (const f of faults) counts[f.code] = (counts[f.code] ?? 0) + 1
    t.same(counts, { SEQ_REGRESSION: 10, ACK_FLOOR_INVALID: 1 }, 'every refusal, from either thread, is in the fault log')
    worker.postMessage({ exit: true })
  })
}
