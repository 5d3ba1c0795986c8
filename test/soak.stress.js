'use strict'
// The short soak (test/soak.js) in `npm run test:stress` (CI's stress step): 1,000,000 operations over 1,000 topics with
// churn, on each backend in its own `node --expose-gc` child. If this fails, a long-running broker
// leaks memory or slots as topics come and go, or a counter of a surviving topic drifts from what
// was recorded. `npm run soak` runs the long form (10,000,000 operations over 10,000 topics).
const t = require('tap')
const { runSoakInChild, availableBackends, SHORT, BOUNDS } = require('./soak')
const { backends, jsonFromChild } = require('./helpers')

t.test('short soak on every backend: counters exact, memory flat, no slot leak', async (t) => {
  const chosen = backends()
  t.same(availableBackends(), chosen, 'soak.js runs the same backends as the other tests')
  // Both children at once: each is single-threaded, and the machine has two cores.
  const results = await Promise.all(chosen.map((backend) => runSoakInChild({ ...SHORT, backend, seed: 7 }, { timeoutMs: 60_000 })))
  for (const r of results) {
    t.same(r.failures, [], `${r.backend}: every surviving counter matches the model, memory and slots stay within bounds`)
    t.equal(r.backend, chosen[results.indexOf(r)], `${r.backend}: the child ran the backend it was asked for`)
    t.ok(r.counts.removed > 1000 && r.counts.created > 2000, `${r.backend}: real churn (${r.counts.created} created, ${r.counts.removed} removed)`)
    t.comment(`${r.backend}: ${r.operations} ops over ${r.topics} topics in ${r.seconds} s; heap +${r.heapGrowthMB} MB (bound ${BOUNDS.heapGrowthBytes / 2 ** 20}), RSS +${r.rssGrowthMB} MB (bound ${BOUNDS.rssGrowthBytes / 2 ** 20}) first→last quarter; slots in use ${r.arena.slotsInUse}, reserved ${r.arena.slotsReserved} (bound ${r.slotBound}); log ${r.arena.logBytes} B`)
  }
})

t.test('a worker does not keep handles of topics the main thread removed', async (t) => {
  // 20,000 topics resolved in a worker and removed by main; before registry.onTopicRemoved the
  // worker kept every dead handle: +19.9 MB of heap here (~1 KB per topic, unbounded with churn).
  const path = require('node:path')
  const churn = path.join(__dirname, 'fixtures', 'worker-churn.js')
  const runs = await Promise.all(backends().map((backend) => jsonFromChild(`worker-churn ${backend}`, ['--expose-gc', churn, backend, '20000'], { timeoutMs: 120_000 })))
  for (const r of runs) t.ok(r.heapGrowthMB < 4, `${r.backend}: worker heap after ${r.topics} removed topics grew ${r.heapGrowthMB} MB (bound 4 MB)`)
})
