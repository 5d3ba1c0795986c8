'use strict'
// Every read lists the live topics ascending by label, then raw name (design §3), however topics
// come and go between reads (lib/core/reader.ts sorts again whenever what its thread knows has
// changed). Names are drawn from a few that sanitize alike, so labels collide and a removed name
// comes back as a new topic; a worker thread registers some, which the main thread learns from the
// registration log. The main thread's reads (snapshot()) and the scrape thread's (/stats) are checked.
const t = require('tap')
const { backends, surfaceOn, prng, request, scriptedWorker } = require('./helpers')

const NAMES = ['a.b', 'a_b', 'a-b', 'a:b', 'b', 'B', 'c', 'c.d', 'c_d', 'd/e', 'd_e', 'é', 'z', 'Z.z', '0', '_0']
const STEPS = 400

/** Sorted as the design says: by label, then by raw name, in JavaScript string order. */
function sortedOk(list) {
  for (let i = 1; i < list.length; i++) {
    const [a, b] = [list[i - 1], list[i]]
    if (a.label > b.label || (a.label === b.label && a.name >= b.name)) return `${JSON.stringify(a)} before ${JSON.stringify(b)}`
  }
  return undefined
}

for (const backend of backends()) {
  t.test(`${backend}: every read lists the live topics in order while topics come and go`, async (t) => {
    const surface = surfaceOn(t, backend)
    const worker = await scriptedWorker(surface)
    t.teardown(() => worker.close())
    const server = await surface.listen({ port: 0 })
    const random = prng(20261129)
    const live = new Set()
    // Many topics already there: a read after a few changes sorts in a short tail.
    for (let i = 0; i < 300; i++) (surface.topic(`bulk.${i}`), live.add(`bulk.${i}`))
    // The worker keeps its handles: one of a removed topic throws once and is let go.
    const inWorker = (name) => worker.call(name, undefined, 'append', 0, 1).catch((error) => {
      if (error.code !== 'TOPIC_REMOVED') throw error
      return worker.call(name, undefined, 'append', 0, 1)
    })
    let reads = 0
    let failures = 0
    for (let step = 0; step < STEPS; step++) {
      const name = NAMES[Math.floor(random() * NAMES.length)]
      const roll = random()
      if (roll < 0.35) (surface.topic(name), live.add(name))
      else if (roll < 0.5) (await inWorker(name), live.add(name))
      else if (roll < 0.75) (surface.removeTopic(name), live.delete(name))
      else {
        const listed = roll < 0.95
          ? surface.snapshot().topics.map(({ name, label }) => ({ name, label }))
          : JSON.parse((await request(server.port, { path: '/stats?filter=topics' })).text).topics.map(({ topic, label }) => ({ name: topic, label }))
        reads++
        const wrong = sortedOk(listed)
        const names = listed.map((topic) => topic.name).sort()
        const expected = [...live].sort()
        if (wrong !== undefined || JSON.stringify(names) !== JSON.stringify(expected)) {
          failures++
          t.fail(`step ${step}: ${wrong ?? `listed ${names.length} topics, ${expected.length} live`}`)
        }
      }
    }
    t.equal(failures, 0, `${reads} reads, each in order and whole`)
    t.ok(reads > 50)
  })
}
