'use strict'
// End to end, with real threads (lib/core/reclamation.ts, docs/reclamation.md): a worker records
// flat out into a topic the main thread removes and recreates thousands of times; no fresh topic
// may ever show a count of a removed one, and removed blocks are reused. A churn run of 4 s per
// backend, so it lives with the stress tests (`npm run test:stress`); the played-thread tests in
// test/removal.test.js are the deterministic guard in `npm test`.
const t = require('tap')
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const { backends, surfaceOn } = require('./helpers')

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

for (const backend of backends()) {
  t.test(`${backend}: a worker recording flat out while the main thread removes and recreates its topic: no stale count ever shows in a new topic`, async (t) => {
    // Without reclamation, 18 of 19,841 fresh topics in 20 s showed counts of the removed one. A
    // weak detector in a few seconds; the played-thread tests above are the guard. This one checks
    // the real thing end to end, and that blocks are reused (not merely never reused).
    const surface = surfaceOn(t, backend)
    const stop = new Int32Array(new SharedArrayBuffer(4))
    const worker = new Worker(path.join(__dirname, 'fixtures', 'removal-worker.js'), { workerData: { shared: surface.share(), stop: stop.buffer }, execArgv: [] })
    const done = new Promise((resolve, reject) => {
      worker.on('message', (m) => m.done && resolve(m))
      worker.on('error', reject)
    })
    await new Promise((resolve) => worker.once('message', resolve))
    let rounds = 0
    const dirty = []
    const before = surface.arenaUsage().slotsReserved
    for (const until = Date.now() + 4_000; Date.now() < until && rounds < 20_000;) {
      surface.topic('a')
      for (const spin = Date.now() + 1; Date.now() < spin;); // the worker picks 'a' up
      surface.removeTopic('a')
      const name = `z${rounds++}`
      surface.topic(name) // nobody records into it
      const z = surface.snapshot().topics.find((x) => x.name === name)
      if (z.produced !== 0 || z.bytes !== 0 || z.groups.length !== 0) dirty.push([name, z.produced])
      surface.removeTopic(name)
      if (rounds % 200 === 0) await sleep(0) // let the worker's messages and timers through
    }
    Atomics.store(stop, 0, 1)
    const report = await done
    await worker.terminate()
    t.ok(rounds > 500 && report.produced > 0, `${rounds} rounds; the worker recorded ${report.produced} messages and re-resolved ${report.removed} times`)
    t.same(dirty, [], 'no fresh topic ever showed a count')
    const grown = surface.arenaUsage().slotsReserved - before
    t.ok(grown < rounds, `removed blocks were reused: ${grown} slots reserved over ${rounds} rounds of 2 topics`)
    t.equal(report.otherErrors, 0, 'the worker only ever saw RemovedTopicError')
  })
}
