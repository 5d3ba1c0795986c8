'use strict'
// Thread rows are reused: a thread that attaches again keeps its row, and the row of a thread
// that has exited — however it ended — goes to the next thread that attaches, which inherits its
// numbers. Totals stay exact and a live thread's row is never handed out (rows-many.stress.js:
// more attaches than there are rows).
const t = require('tap')
const { backends, surfaceOn, faultsOf } = require('./helpers')
const { Memory } = require('../dist/core/memory')
const { MAIN_ROW } = require('../dist/core/layout')
const { threadIdentity, threadAlive, threadState, parseStat } = require('../dist/core/threads')
const { createArena } = require('../dist/core/backend')

const { runRowWorker: run, ENDS } = require('./fixtures/row-worker')

function rowsTopic(surface) {
  return surface.snapshot().topics.find((x) => x.name === 'rows')
}

t.test('a thread identity is its tid and start time, read from /proc', (t) => {
  const me = threadIdentity()
  t.ok(me && me.tid > 0 && me.start >= 0, `this thread is ${JSON.stringify(me)}`)
  t.equal(me.tid, process.pid, 'the main thread\'s tid is the pid')
  t.equal(threadAlive(me.tid, me.start), true, 'this thread is alive')
  t.equal(threadAlive(me.tid, me.start + 1), false, 'a tid reused by a thread that started later is not the owner')
  t.equal(threadAlive(2 ** 31 - 1, 0), false, 'a tid no thread has is not alive')
  t.equal(threadState(me.tid, me.start), 'alive')
  t.equal(threadState(2 ** 31 - 1, 0), 'gone')
  const line = '4242 (a ) (b c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 123456789012 20 21'
  t.same(parseStat(line), { tid: 4242, start: 123456789012 }, 'a thread name holding ") (" and spaces does not shift the fields')
  t.equal(parseStat(''), undefined)
  t.equal(parseStat('not a stat line'), undefined)
  t.equal(parseStat('12 (x) S 1 2'), undefined, 'a line cut short has no start time')
  t.end()
})

/**
 * Several threads played in this one: each Memory claims with an identity of its own, and
 * whether an identity's thread still runs is what `dead` says (the test's stand-in for /proc).
 * `onCheck(tid)` runs inside each liveness question, so a test can act in the middle of one.
 */
function playedThreads(backend) {
  const arena = createArena(backend)
  const dead = new Set()
  const hooks = { onCheck: () => {} }
  const liveness = (tid) => {
    hooks.onCheck(tid)
    return dead.has(tid) ? 'gone' : 'alive'
  }
  const thread = (tid) => ({ tid, start: 5000 + tid })
  const memory = (fresh = false) => new Memory(arena, fresh, liveness)
  return { arena, dead, hooks, thread, memory }
}

for (const backend of backends()) {
  t.test(`${backend}: two threads that find the same dead row at once: one gets it, the other a row of its own`, (t) => {
    const { dead, hooks, thread, memory } = playedThreads(backend)
    t.equal(memory(true).claimRow(thread(1)), MAIN_ROW, 'the creator')
    const x = memory()
    t.equal(x.claimRow(thread(2)), MAIN_ROW + 1)
    dead.add(2)
    // y scans the owner table and asks about x, which is gone; while it asks, z (which also
    // finds x gone) claims x's row. y must then not take that row: it is z's, and z is alive.
    const z = memory()
    let zRow
    hooks.onCheck = (tid) => {
      if (tid !== 2 || zRow !== undefined) return
      zRow = -1
      zRow = z.claimRow(thread(4))
    }
    const y = memory()
    const yRow = y.claimRow(thread(3))
    t.equal(zRow, MAIN_ROW + 1, 'z took the dead thread\'s row')
    t.equal(yRow, MAIN_ROW + 2, 'y took a fresh row, not the one z had just claimed')
    hooks.onCheck = () => {}
    t.equal(memory().claimRow(thread(4)), zRow, 'z attaching again gets its own row back')
    t.equal(memory().claimRow(thread(5)), MAIN_ROW + 3, 'no row is free while its threads run')
    t.end()
  })

  t.test(`${backend}: a lock tag names its holder's claim: a row's next owner never carries the last one's tag`, (t) => {
    const { dead, thread, memory } = playedThreads(backend)
    const creator = memory(true)
    creator.claimRow(thread(1))
    const x = memory()
    x.claimRow(thread(2))
    const xTag = x.lockTag
    t.equal(creator.holderState(xTag), 'alive', 'a live holder is alive')
    dead.add(2)
    t.equal(creator.holderState(xTag), 'gone', 'and gone once its thread is')
    const z = memory()
    t.equal(z.claimRow(thread(3)), MAIN_ROW + 1, 'the row goes to the next thread')
    t.not(z.lockTag, xTag, 'which locks with another tag: a waiter that found x gone cannot take the lock from z')
    t.equal(creator.holderState(z.lockTag), 'alive')
    t.equal(creator.holderState(xTag), 'gone', 'x\'s tag stays gone, whatever /proc says of the row\'s new owner')
    const again = memory()
    again.claimRow(thread(3))
    t.equal(again.lockTag, z.lockTag, 'a thread that attaches again locks with the tag it has: waiters see one holder')
    t.equal(creator.holderState(creator.lockTag), 'alive', 'the creator\'s tag can be checked too')
    dead.add(1)
    t.equal(creator.holderState(creator.lockTag), 'gone')
    t.equal(memory().claimRow(thread(6)), MAIN_ROW + 2, 'but the creator\'s row is never handed out')
    const a = memory()
    t.equal(a.lockTag, -threadIdentity().tid, 'a thread without a row locks with its tid, negated')
    t.equal(creator.holderState(a.lockTag), 'unknown', 'a tid some thread has: maybe the holder, maybe a later thread — the waiter falls back on time')
    t.end()
  })

  t.test(`${backend}: 12 workers one after another, ending every way there is, share one row and lose nothing`, async (t) => {
    const surface = surfaceOn(t, backend, { e2e_latency: true })
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN'] }) // deliveries without floors: rows are the subject
    const shared = surface.share()
    const N = 5_000
    const identities = []
    for (let i = 0; i < 12; i++) {
      const report = await run({ shared, partition: 0, from: i * N, n: N, end: ENDS[i % ENDS.length] })
      t.equal(report.count, N)
      identities.push(`${report.identity.tid}/${report.identity.start}`)
      t.equal(surface.arenaUsage().threadRows, 2, `after worker ${i + 1} (${ENDS[i % ENDS.length]}): the main thread's row and one reused row`)
    }
    t.equal(new Set(identities).size, 12, 'every worker was a thread of its own')
    const s = rowsTopic(surface)
    t.equal(s.produced, 12 * N, 'a row inherited from an exited thread keeps its numbers')
    t.equal(s.bytes, 24 * N)
    t.equal(s.delivered, 12 * N)
    t.equal(s.groups[0].inFlight, 0)
    t.same(s.partitions.map((p) => [p.partition, p.lastSeq]), [[0, 12 * N]], 'each worker continued the partition where the last one stopped')
    t.same(faults, [], 'no faults: no false SEQ_REGRESSION from an inherited last_seq')
  })

  t.test(`${backend}: attachSurface twice in one thread gives that thread one row`, async (t) => {
    const surface = surfaceOn(t, backend)
    const shared = surface.share()
    await run({ shared, partition: 0, from: 0, n: 1_001, attaches: 2, end: 'hang' })
    t.equal(surface.arenaUsage().threadRows, 2)
    t.equal(rowsTopic(surface).produced, 1_001, 'both recorders counted into it')
    await run({ shared, partition: 0, from: 1_001, n: 1_000, attaches: 3 })
    t.equal(surface.arenaUsage().threadRows, 2)
    t.equal(rowsTopic(surface).produced, 2_001)
  })

  t.test(`${backend}: workers churning beside live ones never get a live thread's row; totals exact`, async (t) => {
    const surface = surfaceOn(t, backend, { max_in_flight: 2 ** 31 - 1 })
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN'] }) // deliveries without floors: rows are the subject
    const shared = surface.share()
    const stop = new SharedArrayBuffer(4)
    // Three threads record flat out on partitions 1–3 for the whole test.
    const live = [1, 2, 3].map((partition) => run({ shared, partition, from: 0, end: 'hang', stop }))
    const N = 2_000
    let churned = 0
    const deadline = Date.now() + 20_000
    for (let i = 0; i < 20 && Date.now() < deadline; i++) {
      await run({ shared, partition: 0, from: i * N, n: N, end: ENDS[i % ENDS.length] })
      churned++
    }
    // The main thread's row, the three live ones and one reused by the churn: a live row handed
    // to a churning worker would show as fewer rows and as lost updates below.
    t.equal(surface.arenaUsage().threadRows, 5)
    Atomics.store(new Int32Array(stop), 0, 1)
    const counts = (await Promise.all(live)).map((r) => r.count)
    const s = rowsTopic(surface)
    const total = churned * N + counts.reduce((a, b) => a + b, 0)
    t.ok(churned >= 5, `${churned} workers churned while 3 recorded ${counts.join(', ')}`)
    t.equal(s.produced, total, 'no update lost: no two threads ever shared a row')
    t.equal(s.delivered, total)
    t.equal(s.groups[0].inFlight, 0)
    t.same(s.partitions.map((p) => [p.partition, p.lastSeq]), [[0, churned * N], ...counts.map((c, i) => [i + 1, c])])
    t.same(faults, [])
  })
}
