'use strict'
// A removed topic's or group's slot blocks are reused by later registrations — but only once no
// recording call can still write into them (lib/core/reclamation.ts, docs/reclamation.md). A call
// checks its handle's liveness tag, then writes; a thread can be stopped in between for any
// length of time. A removal clears the tags and advances the epoch; its blocks wait until every
// other thread with a row has announced that epoch from between its tasks (or has exited). Here
// threads are played in this one (so that "stopped between its check and its write" is certain),
// and a real worker is parked inside a call by holding the lock it waits for.
const t = require('tap')
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const { backends, surfaceOn, played, lib } = require('./helpers')
const { Memory } = require('../dist/core/memory')
const { B_EPOCH, SLOTS_PER_CHUNK } = require('../dist/core/layout')
const { acquire, release } = require('../dist/core/lock')
const { threadProgress, threadIdentity } = require('../dist/core/threads')
const { attachArena } = require('../dist/core/backend')
const { G_LOCK } = require('../dist/core/entities')
const { announce, detach, passedEpoch } = require('../dist/core/reclamation')

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

for (const backend of backends()) {
  t.test(`${backend}: a removed topic's block waits until every other thread has announced the removal`, (t) => {
    const { main, worker, topicNumbers } = played(backend)
    const c = worker.handles.topic('c')
    c.produced(0, 1, 10)
    const cSlot = c.entity.slot
    t.equal(main.registry.removeTopic('c'), true)
    // The worker was stopped just after its handle's liveness check, before its write.
    const d = main.registry.topic('d')
    t.not(d.slot, cSlot, 'a topic registered now gets a fresh block: the worker has not announced since the removal')
    // The worker runs again and makes its write: into c's old block, in its own row.
    const [cells, index] = worker.recorder.cells(cSlot)
    cells[index] += 1
    t.equal(topicNumbers('d').produced, 0, 'the new topic shows none of it')
    // Between two tasks, the worker announces: it is past every call it began before.
    announce(worker.memory)
    const e = main.registry.topic('e')
    t.equal(e.slot, cSlot, 'then the block is reused (a topic block: blocks wait in queues by kind)')
    t.equal(topicNumbers('e').produced, 0, 'zeroed in every row, the late write included')
    t.equal(topicNumbers('e').bytes, 0)
    t.throws(() => c.produced(0, 2, 1), { code: 'TOPIC_REMOVED' }, 'and the old handle, running again, throws instead of writing')
    t.end()
  })

  t.test(`${backend}: a checkpoint that names a new topic of a removed one's name leaves one topic of that name`, (t) => {
    // The main thread knows 't'; the worker removes it, registers 't' again and compacts the log:
    // replaying the checkpoint, the main thread learns the new 't' before it forgets the old one.
    const { main, worker, read } = played(backend)
    main.handles.topic('t').append(0, 1)
    worker.registry.sync()
    worker.registry.removeTopic('t')
    const again = worker.handles.topic('t')
    again.append(0, 1, 3)
    worker.memory.lock()
    try {
      worker.registry.sync()
      worker.registry.compact()
    } finally {
      worker.memory.unlock()
    }
    main.registry.sync()
    t.equal(main.handles.topic('t').entity.id, again.entity.id, "the name resolves to the worker's new topic")
    main.handles.topic('t').append(0, 1)
    for (const side of [main, worker]) {
      t.same(read(side).filter((x) => x.name === 't').map((x) => x.produced), [4], 'one series of that name, every count in it')
    }
    t.end()
  })

  t.test(`${backend}: a removed group's blocks wait the same way, and its counts stay its topic's`, (t) => {
    const { main, worker, topicNumbers } = played(backend)
    const topic = worker.handles.topic('t')
    topic.produced(0, 3, 30, 3)
    const g = topic.group('g')
    g.dispatch(3)
    g.delivered(2)
    const gSlot = g.entity.slot
    t.equal(main.registry.removeGroup(main.registry.topic('t'), 'g'), true)
    t.equal(topicNumbers('t').groups.length, 0, 'its series leave at once')
    t.equal(topicNumbers('t').delivered, 2, 'its deliveries stay in the topic')
    // The worker was stopped between its check and its write of a delivery: it lands now.
    const [cells, index] = worker.recorder.cells(gSlot)
    cells[index] += 1
    t.equal(topicNumbers('t').delivered, 3, 'a call under way when the group was removed still counts for the topic')
    const h = main.registry.group(main.registry.topic('t'), 'h', 10)
    t.not(h.slot, gSlot, 'a group registered now gets a fresh block')
    announce(worker.memory)
    const k = main.registry.group(main.registry.topic('t'), 'k', 10)
    t.equal(k.slot, gSlot, 'once the worker announced, the block is reused…')
    const numbers = topicNumbers('t')
    t.equal(numbers.delivered, 3, '…the removed group\'s counts retired into its topic\'s')
    t.same(numbers.groups.map((x) => [x.name, x.delivered, x.inFlight]), [['h', 0, 0], ['k', 0, 0]], 'and the new group starts from zero')
    t.throws(() => g.delivered(1), { code: 'GROUP_REMOVED' })
    t.end()
  })

  t.test(`${backend}: a thread that exited, or said so on exit, holds nothing back; one that cannot be told of does`, (t) => {
    const { threads, main, worker, side } = played(backend)
    const anonymous = side(false, null) // no /proc identity: only its announcement or detach counts
    worker.handles.topic('a').produced(0, 1, 1)
    const slot = main.registry.topic('a').slot
    main.registry.removeTopic('a')
    announce(anonymous.memory)
    t.not(main.registry.topic('b').slot, slot, 'the worker may still write: fresh block')
    threads[2].alive = false
    return sleep(6).then(() => { // /proc is asked at most every 5 ms by an allocating thread
      t.equal(main.registry.topic('c').slot, slot, 'the worker exited: its row holds nothing back')
      main.registry.removeTopic('c')
      t.not(main.registry.topic('d').slot, slot, 'the anonymous thread has not announced since')
      detach(anonymous.memory)
      t.equal(main.registry.topic('e').slot, slot, 'it detached (its exit): reused')
    })
  })

  t.test(`${backend}: a real worker parked inside dispatch() holds reuse back, then finds its group gone`, { skip: threadIdentity() ? false : 'no /proc' }, async (t) => {
    const surface = surfaceOn(t, backend)
    const group = surface.topic('t').group('g')
    group.dispatch(1)
    const worker = new Worker(`
      const { workerData, parentPort } = require('node:worker_threads')
      const { attachSurface } = require(${JSON.stringify(path.join(__dirname, '..', 'dist'))})
      const g = attachSurface(workerData.shared).topic('t').group('g')
      parentPort.postMessage('ready')
      parentPort.once('message', () => {
        try { g.dispatch(5); parentPort.postMessage('dispatched') } catch (error) { parentPort.postMessage(error.code) }
      })
    `, { eval: true, workerData: { shared: surface.share() }, execArgv: [] })
    await new Promise((resolve) => worker.once('message', resolve))
    await sleep(30) // the worker announces from its idle event loop
    // Hold the group's dispatch lock: the worker's dispatch() passes its liveness check and waits
    // for it, inside its call.
    const holder = lockOf(surface, group)
    acquire(holder.cells, holder.index, holder.tag)
    worker.postMessage('go')
    await sleep(50) // it is parked in acquire() now, inside its call
    const oldSlot = group.entity.slot
    t.equal(surface.topic('t').removeGroup('g'), true)
    await sleep(30) // the main thread announces; the parked worker cannot
    const fresh = surface.topic('t').group('h')
    t.not(fresh.entity.slot, oldSlot, 'a group registered while the worker is parked gets a fresh block')
    const answer = new Promise((resolve) => worker.once('message', resolve))
    release(holder.cells, holder.index, holder.tag)
    t.equal(await answer, 'GROUP_REMOVED', 'the parked dispatch finds its group gone once it runs')
    await sleep(40) // now idle: it announces
    const reused = surface.topic('t').group('k')
    t.equal(reused.entity.slot, oldSlot, 'then the block is reused')
    t.equal(surface.stats('groups', { topic: 't', group: 'k' }).groups[0].in_flight, 0, 'and shows none of the stale dispatch')
    await worker.terminate()
  })

  t.test(`${backend}: the log is compacted: bounded by what is alive; a thread behind it replays the checkpoint`, (t) => {
    const { main, worker, side, read } = played(backend)
    main.registry.compactMinInts = 2048
    const keep = worker.handles.topic('keep')
    keep.produced(3, 1, 7)
    const kg = keep.group('kg')
    kg.dispatch(1)
    kg.delivered(1)
    kg.ackFloor(3, 1)
    const gone = worker.handles.topic('gone')
    const goneGroup = keep.group('leaves')
    announce(worker.memory)
    main.registry.removeTopic('gone')
    main.registry.removeGroup(main.registry.topic('keep'), 'leaves')
    const sizes = []
    for (let i = 0; i < 3000; i++) {
      const x = main.registry.topic(`x${i % 50}`)
      main.registry.partition(x, i % 7)
      main.registry.group(x, 'g', 10)
      main.registry.removeTopic(`x${i % 50}`)
      announce(worker.memory)
      if (i % 500 === 499) sizes.push(main.registry.arenaUsage().logBytes)
    }
    t.ok(Math.max(...sizes) < 2048 * 4 * 3, `log bytes stay bounded: ${sizes.join(', ')}`)
    // The worker has replayed nothing since: it catches up through a checkpoint.
    t.throws(() => gone.produced(0, 1, 1), { code: 'TOPIC_REMOVED' })
    t.throws(() => goneGroup.dispatch(1), { code: 'GROUP_REMOVED' })
    keep.produced(3, 2, 7)
    kg.dispatch(1)
    kg.delivered(1)
    kg.ackFloor(3, 2)
    worker.registry.sync()
    t.same([...worker.registry.topics.keys()].sort(), [...main.registry.topics.keys()].sort(), 'the worker knows exactly the live topics')
    t.equal(worker.handles.topic('keep'), keep, 'its handles of live topics are the same objects')
    const late = side(false, 3)
    const strip = (topics) => JSON.stringify(topics, (k, v) => (k === 'key' ? undefined : typeof v === 'bigint' ? String(v) : v))
    t.equal(strip(read(late)), strip(read(main)), 'a thread that attaches now sees what the main thread sees')
    t.equal(strip(read(worker)), strip(read(main)), 'and so does the worker that caught up')
    const k = read(main).find((x) => x.name === 'keep')
    t.same([k.produced, k.delivered, k.lastSeq[0], k.groups[0].ackFloors[0]], [2, 2, 2, 2])
    t.end()
  })

  t.test(`${backend}: totals past 2^64 stay exact through checkpoints and a removed group's retirement`, (t) => {
    // A log entry's amount is 64 bits: a counter's folds summed in a checkpoint, or a removed
    // group's totals, can be more (4,096 folds of 2^52). They are written as several entries.
    const { main, worker, side, read } = played(backend)
    main.registry.compactMinInts = 2048
    worker.registry.compactMinInts = 2048
    const topic = worker.handles.topic('big')
    const keep = topic.group('keep')
    const leaves = topic.group('leaves')
    const N = 5000
    const total = BigInt(N) * 2n ** 52n
    for (let i = 0; i < N; i++) {
      keep.redelivered(2 ** 52) // every call past 2^53 folds
      leaves.dispatched(2 ** 52)
      leaves.delivered(2 ** 52)
    }
    main.registry.removeGroup(main.registry.topic('big'), 'leaves')
    announce(worker.memory)
    const before = read(main).find((x) => x.name === 'big')
    t.same([BigInt(before.delivered), BigInt(before.groups[0].retries)], [total, total], 'exact before the retirement')
    for (let i = 0; i < N; i++) keep.redelivered(2 ** 52) // more checkpoints, with the retired totals in them
    const late = side(false, 3) // replays the last checkpoint
    for (const [who, reader] of [['the main thread', main], ['a thread attached now', late]]) {
      const big = read(reader).find((x) => x.name === 'big')
      t.same([big.groups.length, BigInt(big.delivered), BigInt(big.groups[0].retries)], [1, total, 2n * total], `${who}: the group retired, both totals exact`)
    }
    t.end()
  })
}

/**
 * A group's dispatch lock, as Group finds it, and a tag to hold it with: a thread without a row
 * (−tid), which a waiter cannot prove gone, so it waits (up to 5 s) instead of taking the lock over.
 */
function lockOf(surface, group) {
  const memory = new Memory(attachArena(surface.share().arena), false)
  const c = Math.floor(group.entity.slot / SLOTS_PER_CHUNK)
  return { cells: memory.sharedI32(c), index: ((group.entity.slot % SLOTS_PER_CHUNK) + G_LOCK) * 2, tag: memory.lockTag }
}

t.test('a worker that sleeps does not hold freed slots back', { skip: threadIdentity() ? false : 'no /proc' }, async (t) => {
  // An idle worker (waiting for messages) neither blocks again nor runs: before sleeping threads
  // were left out of fences, 200 removals made 1,990 fresh slots instead of reusing 10.
  const surface = surfaceOn(t, 'js')
  const worker = new Worker(`
    const { workerData, parentPort } = require('node:worker_threads')
    const { attachSurface } = require(${JSON.stringify(path.join(__dirname, '..', 'dist'))})
    attachSurface(workerData.shared).topic('w').produced(0, 1, 1)
    parentPort.postMessage('idle')
    parentPort.once('message', () => process.exit(0))
  `, { eval: true, workerData: { shared: surface.share() }, execArgv: [] })
  await new Promise((resolve) => worker.once('message', resolve))
  await sleep(20)
  const before = surface.arenaUsage().slotsReserved
  for (let i = 0; i < 200; i++) {
    surface.topic('churn').group('g').dispatch(1)
    surface.removeTopic('churn')
    await sleep(7)
  }
  const grown = surface.arenaUsage().slotsReserved - before
  worker.postMessage('done')
  await new Promise((resolve) => worker.once('exit', resolve))
  t.ok(grown <= 100, `200 removals beside an idle worker: ${grown} fresh slots`)
})

t.test('threadProgress reads CPU time and block count from /proc', { skip: threadIdentity() ? false : 'no /proc' }, async (t) => {
  const me = threadIdentity()
  const before = threadProgress(me.tid)
  t.ok(before.cpuNs > 0 && before.blocked >= 0, JSON.stringify(before))
  // Spin until 40 ms more CPU time shows (bounded: 5 s of wall time on a loaded machine).
  let after = before
  for (const until = Date.now() + 5_000; Date.now() < until && after.cpuNs - before.cpuNs < 40e6;) after = threadProgress(me.tid)
  t.ok(after.cpuNs - before.cpuNs >= 40e6, `spinning shows as CPU time (${((after.cpuNs - before.cpuNs) / 1e6).toFixed(1)} ms)`)
  // Waits in the event loop until one shows (bounded): a wait that found an event already pending
  // (a message from the test runner) returns without blocking, so one sleep can show none.
  let blocked = false
  for (let i = 0; i < 50 && !blocked; i++) {
    await sleep(20)
    blocked = threadProgress(me.tid).blocked > after.blocked
  }
  t.ok(blocked, 'waiting in the event loop shows as a block')
  t.equal(threadProgress(2 ** 22 + 5), undefined, 'no such thread: undefined')
})

for (const backend of backends()) {
  t.test(`${backend}: a removal wakes a waiting thread, which announces at once (no timer needed)`, async (t) => {
    // The worker's waits lose their timeout (ANNOUNCE_WAIT_MS, the backstop): only the removal's
    // ring can wake it, so each announcement below is the ring's doing, or the test times out.
    const surface = surfaceOn(t, backend)
    const worker = new Worker(`
      const { workerData, parentPort } = require('node:worker_threads')
      const waitAsync = Atomics.waitAsync
      Atomics.waitAsync = (cells, index, value) => waitAsync(cells, index, value)
      const { attachSurface } = require(${JSON.stringify(path.join(__dirname, '..', 'dist'))})
      attachSurface(workerData.shared).topic('w').produced(0, 1, 1)
      parentPort.postMessage('idle')
      parentPort.once('message', () => process.exit(0))
    `, { eval: true, workerData: { shared: surface.share() }, execArgv: [] })
    await new Promise((resolve) => worker.once('message', resolve))
    const memory = new Memory(attachArena(surface.share().arena), false)
    for (let i = 0; i < 3; i++) {
      surface.topic(`gone${i}`).produced(0, 1, 1)
      surface.removeTopic(`gone${i}`)
      const epoch = Number(Atomics.load(memory.wide, B_EPOCH))
      const deadline = Date.now() + 5000
      while (passedEpoch(memory, false) < epoch && Date.now() < deadline) await sleep(2)
      t.equal(passedEpoch(memory, false), epoch, `removal ${i + 1}: every row, the idle worker's too, has announced epoch ${epoch}`)
    }
    worker.postMessage('done')
    await new Promise((resolve) => worker.once('exit', resolve))
  })

  t.test(`${backend}: attachSurface() on the main thread beside the surface announces too: removed blocks are reused`, async (t) => {
    // That attach claims a row of its own on this thread. Unannounced, the row would hold every
    // freed block back for good (the thread is alive): each removal would take fresh ones.
    const surface = surfaceOn(t, backend)
    lib.attachSurface(surface.share()).topic('beside').produced(0, 1, 1)
    const before = surface.arenaUsage().slotsReserved
    for (let round = 0; round < 10; round++) {
      for (let i = 0; i < 50; i++) {
        surface.topic(`t${round}-${i}`).produced(0, 1, 1)
        surface.removeTopic(`t${round}-${i}`)
      }
      await sleep(20)
    }
    const grown = surface.arenaUsage().slotsReserved - before
    t.ok(grown <= 60, `500 topics made and removed took ${grown} slots more (a few blocks; unannounced, a block per removal: 3,000)`)
  })
}
