'use strict'
// A thread that catches up with the registration log in parts (registry.syncUntil: the scrape
// thread, started on a large surface, replays the log a hold of the lock at a time instead of
// keeping every registration waiting for the whole replay). Between two parts other threads
// register, remove, and compact the log (a new generation begins with a checkpoint, which the
// catching-up thread may be halfway through): once caught up, it must know exactly what the
// thread that did all that knows, and read the same numbers. Threads are played in this one
// (helpers.played), so every interleaving below is certain.
const t = require('tap')
const { backends, played } = require('./helpers')

/** What a read shows, as text (the entity keys, which differ between threads, are left out). */
const shown = (topics) => JSON.stringify(topics)

for (const backend of backends()) {
  t.test(`${backend}: a log replayed in parts, with registrations, removals and compactions between the parts`, async (t) => {
    const { main, side, read } = played(backend)
    const removeTopic = (name) => (main.registry.removeTopic(name), main.handles.forget(name)) // as surface.removeTopic() does
    // A history: topics whose labels collide in pairs (a/1 and a_1), groups, counts, removals.
    for (let i = 0; i < 150; i++) {
      const topic = main.handles.topic(i % 10 === 0 ? `a/${i}` : `a_${i}`)
      topic.produced(0, 5 + i, 100)
      const group = topic.group(`g${i % 3}`)
      group.ackFloor(0, 2)
      group.delivered(2)
      if (i % 7 === 0) topic.group('extra').redelivered(3)
    }
    for (let i = 10; i < 150; i += 10) main.handles.topic(`a/${i}`) // the pairs: a/10 and a_10…
    for (let i = 10; i < 150; i += 20) main.handles.topic(`a_${i}`).group('g0').delivered(1)
    main.registry.whileSynced(() => main.registry.compact()) // generation 2: the scrape thread's log starts with a checkpoint
    for (let i = 0; i < 40; i++) main.handles.topic(`b${i}`).produced(0, 1, 10)

    const scrape = side(false, 3) // a thread that has replayed nothing
    let parts = 0
    const part = () => (parts++, scrape.registry.syncUntil(-Infinity)) // a deadline passed: the fewest entries a part replays
    t.notOk(part(), 'the first part does not reach the end of the log')
    // Between parts: a topic the catching-up thread has replayed is removed, one it has not, one of a colliding pair (its share is carried).
    removeTopic('a_1')
    removeTopic('b39')
    removeTopic('a/20')
    main.handles.topic('c').group('late').dispatch(2)
    main.handles.topic('a_30').removeGroup('g0')
    t.notOk(part(), 'a second part, the log grown meanwhile')
    main.registry.whileSynced(() => main.registry.compact()) // generation 3, its checkpoint begun by the next part
    t.notOk(part(), 'a part that stops inside the new checkpoint')
    removeTopic('a_40')
    main.registry.whileSynced(() => main.registry.compact()) // generation 4 while that checkpoint is half replayed
    main.handles.topic('d').produced(0, 3, 30)
    while (!part()) t.ok(parts < 1000, 'the parts end')
    t.ok(parts >= 4, `caught up in ${parts} parts`)
    t.same([...scrape.registry.topics.keys()].sort(), [...main.registry.topics.keys()].sort(), 'it knows the same topics')
    t.equal(shown(read(scrape)), shown(read(main)), 'and reads the same numbers, carried shares included')
    t.equal(shown(read(main)).includes('"name":"a_1"'), false, 'a removed topic is not read')
  })
}

// A lock taken over from a stopped holder leaves a recount owed (C_RECOUNT): every shared count of
// partitions and windows is set again from the picture. Made from a picture half replayed, it
// would set a topic's count below what the log registered; it waits until the parts are done.
for (const backend of backends()) {
  t.test(`${backend}: a recount owed waits until the parts are caught up`, async (t) => {
    const path = require('node:path')
    const { C_RECOUNT, SLOTS_PER_CHUNK } = require(path.join(__dirname, '..', 'dist', 'core', 'layout'))
    const { T_PARTITIONS } = require(path.join(__dirname, '..', 'dist', 'core', 'entities'))
    const { main, side } = played(backend)
    for (let i = 0; i < 60; i++) {
      const topic = main.handles.topic(`t${i}`)
      topic.produced(0, 1, 10) // a partition first…
      topic.group('g') // …a group's entry between…
      for (let p = 1; p < 4; p++) topic.produced(p, 1, 10) // …and more partitions after it
    }
    const partitions = (name) => {
      const slot = main.registry.topics.get(name).slot + T_PARTITIONS
      return main.memory.sharedI32(Math.floor(slot / SLOTS_PER_CHUNK))[(slot % SLOTS_PER_CHUNK) * 2]
    }
    const counts = () => Array.from({ length: 60 }, (_, i) => partitions(`t${i}`))
    t.same(new Set(counts()), new Set([4]), 'every topic counts its 4 partitions')
    const scrape = side(false, 3)
    main.memory.control[C_RECOUNT] = 1 // as after a lock taken over from a stopped holder
    t.notOk(scrape.registry.syncUntil(-Infinity), 'a first part, far from the end of the log')
    t.equal(main.memory.control[C_RECOUNT], 1, 'the recount is still owed')
    t.same(new Set(counts()), new Set([4]), 'no count set from the half-replayed picture')
    while (!scrape.registry.syncUntil(-Infinity));
    t.equal(main.memory.control[C_RECOUNT], 0, 'recounted once caught up')
    t.same(new Set(counts()), new Set([4]), 'to what the log registered')
  })
}
