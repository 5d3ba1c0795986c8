'use strict'
// Issue #4: the quorum tier, admitWrite(), read-only effects and /healthz — one source of truth.
const t = require('tap')
const { lib, backends, surfaceOn, faultsOf, topicNumbers } = require('./helpers')

const ANSWERS = [
  { ok: true, durability: 'quorum' },
  { ok: true, durability: 'quorum', code: 0x6004, name: 'FOLLOWER_LAG' },
  { ok: false, code: 0x6002, name: 'READ_ONLY_DEGRADED' },
]
const STATUS = ['healthy', 'soft', 'read_only']

/** Reads the tier from all five places; they must agree. */
async function views(surface, url) {
  const gauge = Number(/^mq_quorum_state (\d+)$/m.exec(surface.render())[1])
  const response = await fetch(`${url}/healthz`)
  const healthz = await response.json()
  const stats = surface.stats('quorum')
  return { state: surface.quorumState, gauge, http: response.status, healthz, stats, answer: surface.admitWrite() }
}

function agree(t, v, tier, message) {
  t.equal(v.state, tier, `${message}: surface.quorumState`)
  t.equal(v.gauge, tier, `${message}: mq_quorum_state gauge`)
  t.equal(v.http, tier === 2 ? 503 : 200, `${message}: /healthz HTTP status`)
  t.match(v.healthz, { status: STATUS[tier], quorum_state: tier, runbook_level: 2 - tier }, `${message}: /healthz body`)
  t.match(v.stats, { filter: 'quorum', quorum_state: tier, status: STATUS[tier], runbook_level: 2 - tier }, `${message}: stats('quorum')`)
  t.same(v.answer, ANSWERS[tier], `${message}: admitWrite()`)
}

t.test('exported codes', async (t) => {
  t.equal(lib.READ_ONLY_DEGRADED, 0x6002)
  t.equal(lib.FOLLOWER_LAG, 0x6004)
})

for (const backend of backends()) {
  t.test(`${backend}: round sequences → tier in every view`, async (t) => {
    const surface = surfaceOn(t, backend)
    const server = await surface.listen({ port: 0 })
    agree(t, await views(surface, server.url), 0, 'before any round')
    const cases = [
      // [replicas, inSync, expected tier, why]
      [3, 3, 0, 'all in sync → healthy'],
      [3, 2, 1, 'majority but not all → soft'],
      [3, 1, 2, 'no majority → read_only'],
      [3, 2, 1, 'a round with a majority clears read_only (to soft)'],
      [3, 1, 2, 'read_only again'],
      [3, 3, 0, 'read_only → healthy directly'],
      [4, 2, 2, 'exactly half is not a majority'],
      [4, 3, 1, '3 of 4 is a majority'],
      [1, 1, 0, 'a single node in sync is healthy'],
      [1, 0, 2, 'a single node not in sync is read_only'],
      [5, 0, 2, 'nothing in sync'],
      [2, 2, 0, 'two of two'],
    ]
    for (const [replicas, inSync, tier, why] of cases) {
      t.equal(surface.replicationRound({ replicas, inSync }), tier, `${replicas}/${inSync}: ${why}`)
      const v = await views(surface, server.url)
      agree(t, v, tier, `${replicas}/${inSync}`)
      t.match(v.healthz, { replicas, in_sync: inSync }, '/healthz shows the last round')
    }
  })

  t.test(`${backend}: invalid rounds are TypeErrors (not a number) or RangeErrors (out of range) and change nothing`, async (t) => {
    const surface = surfaceOn(t, backend)
    surface.replicationRound({ replicas: 3, inSync: 2 })
    const show = (round) => `{ ${Object.entries(round).map(([k, v]) => `${k}: ${typeof v === 'string' ? JSON.stringify(v) : typeof v === 'bigint' ? `${v}n` : v}`).join(', ')} }`
    for (const round of [{ replicas: 3, inSync: 4 }, { replicas: 0, inSync: 0 }, { replicas: -1, inSync: 0 },
      { replicas: 3, inSync: -1 }, { replicas: 2.5, inSync: 1 }, { replicas: 3, inSync: 1.5 }, { replicas: NaN, inSync: 1 }, { replicas: 3, inSync: Infinity }]) {
      t.throws(() => surface.replicationRound(round), RangeError, show(round))
    }
    // api.md's rule: a TypeError for a value that is not a number (a missing field included).
    for (const [round, key] of [[{ replicas: '3', inSync: 1 }, 'replicas'], [{ replicas: 3, inSync: '1' }, 'inSync'], [{ replicas: null, inSync: 1 }, 'replicas'],
      [{ replicas: 3n, inSync: 1 }, 'replicas'], [{ inSync: 1 }, 'replicas'], [{ replicas: 3 }, 'inSync'], [{}, 'replicas']]) {
      t.throws(() => surface.replicationRound(round), { name: 'TypeError', message: new RegExp(`^${key} must be an integer`) }, show(round))
    }
    t.throws(() => surface.replicationRound(null), TypeError)
    // Own fields only, as the configuration reads its keys: an inherited field is not one the caller wrote.
    t.throws(() => surface.replicationRound(Object.create({ replicas: 3, inSync: 3 })), { name: 'TypeError', message: /^replicas must be an integer/ }, 'inherited fields are not read')
    t.throws(() => surface.replicationRound([]), { name: 'TypeError', message: /expects { replicas, inSync, lagging\? }, got an array/ })
    // A misspelt field is an error, not a round read from the fields that happen to be right.
    t.throws(() => surface.replicationRound({ replicas: 3, inSync: 3, insync: 1 }), { name: 'TypeError', message: 'unknown replicationRound field "insync" (known: replicas, inSync, lagging)' })
    t.throws(() => surface.replicationRound({ replicas: 3, in_sync: 3 }), TypeError)
    t.equal(surface.quorumState, 1, 'a refused round must not change the tier')
    t.match(surface.stats('quorum'), { replicas: 3, in_sync: 2 })
  })

  t.test(`${backend}: lagging names the replicas out of sync on /healthz, in stats('quorum') and the 'quorum' event; a wrong list is refused and changes nothing`, async (t) => {
    const surface = surfaceOn(t, backend)
    const server = await surface.listen({ port: 0 })
    const events = []
    surface.on('quorum', (e) => events.push(e))
    const shown = async () => [(await (await fetch(`${server.url}/healthz`)).json()).lagging, surface.stats('quorum').lagging]
    t.same(await shown(), [null, null], 'before any round: none named')
    t.equal(surface.replicationRound({ replicas: 3, inSync: 2, lagging: ['node-3'] }), 1)
    t.same(await shown(), [['node-3'], ['node-3']])
    t.same(events.at(-1), { from: 0, to: 1, replicas: 3, inSync: 2, lagging: ['node-3'], at: events.at(-1).at })
    const names = ['node-2', 'node-3']
    surface.replicationRound({ replicas: 3, inSync: 1, lagging: names })
    names.push('node-4') // the surface keeps its own copy
    t.same(await shown(), [['node-2', 'node-3'], ['node-2', 'node-3']])
    t.same(events.at(-1).lagging, ['node-2', 'node-3'])
    t.ok(Object.isFrozen(surface.stats('quorum').lagging), 'a frozen copy')
    // Wrong lists: nothing of the round is taken (the tier, the counts, the names stay).
    const refused = [
      [{ replicas: 3, inSync: 2, lagging: 'node-3' }, TypeError, /^lagging must be an array/],
      [{ replicas: 3, inSync: 2, lagging: [3] }, TypeError, /^lagging must hold replica names \(strings\), got 3/],
      [{ replicas: 3, inSync: 2, lagging: [] }, RangeError, /^lagging must name the 1 replica out of sync \(replicas − inSync\), got 0/],
      [{ replicas: 3, inSync: 2, lagging: ['a', 'b'] }, RangeError, /^lagging must name the 1 replica out of sync/],
      [{ replicas: 3, inSync: 1, lagging: ['a', 'a'] }, RangeError, /^lagging names a replica twice/],
      [{ replicas: 3, inSync: 2, lagging: [''] }, RangeError, /of length 1 to 256, got 0/],
      [{ replicas: 3, inSync: 2, lagging: ['x'.repeat(257)] }, RangeError, /of length 1 to 256, got 257/],
      [{ replicas: 3, inSync: 2, lagging: ['node\u001b[2J'] }, RangeError, /no control character/],
      [{ replicas: 3, inSync: 2, lagging: ['node\u0085'] }, RangeError, /no control character/],
      [{ replicas: 3, inSync: 2, lagging: ['node\u20283'] }, RangeError, /line separator/],
      [{ replicas: 3, inSync: 2, lagging: ['node\ud8003'] }, RangeError, /lone surrogate/],
      [{ replicas: 3, inSync: 2, lagging: ['node\udc00'] }, RangeError, /lone surrogate/],
      [{ replicas: 3, inSync: 2, lagging: [' '] }, RangeError, /must not begin or end with a space/],
      [{ replicas: 3, inSync: 2, lagging: ['node-3 '] }, RangeError, /must not begin or end with a space/],
      [{ replicas: 3, inSync: 4, lagging: [] }, RangeError, /^inSync must be/],
    ]
    const ascii = (round) => JSON.stringify(round).replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`) // a U+2028 would end TAP's line
    for (const [round, type, message] of refused) t.throws(() => surface.replicationRound(round), { name: type.name, message }, ascii(round))
    t.same([surface.quorumState, surface.stats('quorum').in_sync, ...(await shown())], [2, 1, ['node-2', 'node-3'], ['node-2', 'node-3']], 'the last good round stands')
    t.equal(events.length, 2, 'no event for a refused round')
    surface.replicationRound({ replicas: 3, inSync: 3, lagging: [] })
    t.same(await shown(), [[], []], 'all in sync: an empty list')
    surface.replicationRound({ replicas: 3, inSync: 2 })
    t.same(await shown(), [null, null], 'a round that does not name them: null, not the names of an older round')
    surface.replicationRound({ replicas: 3, inSync: 2, lagging: ['rack 2/node \u{1f600}'] })
    t.same(await shown(), [['rack 2/node \u{1f600}'], ['rack 2/node \u{1f600}']], 'a space inside a name, a surrogate pair')
    surface.replicationRound({ replicas: 3, inSync: 2, lagging: null })
    t.same(await shown(), [null, null], 'null, as /healthz shows it: not named')
    t.equal(surface.replicationRound({ replicas: 300, inSync: 1, lagging: Array.from({ length: 299 }, (_, i) => `n${i}`) }), 2, 'many replicas')
  })

  t.test(`${backend}: 'quorum' events fire exactly on tier changes`, async (t) => {
    const surface = surfaceOn(t, backend)
    const events = []
    surface.on('quorum', (e) => events.push(e))
    for (const [replicas, inSync] of [[3, 3], [3, 3], [3, 2], [3, 2], [3, 1], [3, 0], [3, 2], [3, 3]]) {
      surface.replicationRound({ replicas, inSync })
    }
    t.same(events.map(({ from, to, replicas, inSync }) => ({ from, to, replicas, inSync })), [
      { from: 0, to: 1, replicas: 3, inSync: 2 },
      { from: 1, to: 2, replicas: 3, inSync: 1 },
      { from: 2, to: 1, replicas: 3, inSync: 2 },
      { from: 1, to: 0, replicas: 3, inSync: 3 },
    ])
    for (const e of events) t.ok(!Number.isNaN(Date.parse(e.at)), 'each event carries a timestamp')
  })

  t.test(`${backend}: read_only refuses produced(); reads, acks and deliveries keep working`, async (t) => {
    const surface = surfaceOn(t, backend)
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN'] })
    const topic = surface.topic('t')
    const group = topic.group('g')
    topic.produced(0, 2, 20, 2)
    group.dispatch(2)
    surface.replicationRound({ replicas: 3, inSync: 1 })
    t.equal(topic.produced(0, 3, 10), false, 'a write in read_only is refused')
    t.equal(topic.produced(5, 1, 10), false, 'also on a new partition')
    t.match(faults, [{ code: 'WRITE_WHILE_READ_ONLY', attempted: 3, previous: 2 }, { code: 'WRITE_WHILE_READ_ONLY' }])
    t.equal(group.ackFloor(0, 1), true, 'acks keep working')
    group.delivered(1)
    const n = topicNumbers(surface, 't')
    t.same([n.produced, n.bytes, n.partitions.length, n.partitions[0].lastSeq, n.delivered], [2, 20, 1, 2, 1],
      'nothing produced in read_only is counted and the ceiling is frozen')
    surface.replicationRound({ replicas: 3, inSync: 2 })
    t.equal(topic.produced(0, 3, 10), true, 'writes resume once a majority is back')
  })

  t.test(`${backend}: seeded random rounds interleaved with produces — all views agree`, async (t) => {
    const surface = surfaceOn(t, backend)
    const server = await surface.listen({ port: 0 })
    faultsOf(surface)
    let seed = 42
    const random = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff)
    const topic = surface.topic('r')
    let seq = 0
    let accepted = 0
    let previousLastSeq = 0
    let mismatches = 0
    let steps = 0
    for (let step = 0; step < 1000; step++) {
      const replicas = 1 + Math.floor(random() * 5)
      const inSync = Math.floor(random() * (replicas + 1))
      const tier = surface.replicationRound({ replicas, inSync })
      for (let k = 0; k < 3; k++) {
        const ok = topic.produced(0, seq + 1, 1)
        if (ok) { seq++; accepted++ }
        if (ok === (tier === 2)) mismatches++
      }
      const v = await views(surface, server.url)
      const lastSeq = topicNumbers(surface, 'r')?.partitions[0]?.lastSeq ?? 0
      const expected = inSync * 2 <= replicas ? 2 : inSync < replicas ? 1 : 0
      if (v.state !== expected || v.gauge !== expected || v.healthz.quorum_state !== expected || v.stats.quorum_state !== expected ||
        v.http !== (expected === 2 ? 503 : 200) || JSON.stringify(v.answer) !== JSON.stringify(ANSWERS[expected]) || lastSeq < previousLastSeq) {
        mismatches++
      }
      previousLastSeq = lastSeq
      steps++
    }
    t.equal(steps, 1000)
    t.equal(mismatches, 0, 'every view agrees after every step, and last_seq never decreases')
    t.equal(topicNumbers(surface, 'r').produced, accepted, 'only writes accepted outside read_only are counted')
  })
}

t.test('a listener for an event a surface never emits is an error, not a silent no-op', async (t) => {
  const surface = lib.createSurface()
  t.teardown(() => surface.close())
  const noop = () => {}
  for (const method of ['on', 'once', 'addListener', 'prependListener', 'prependOnceListener']) {
    for (const event of ['faults', 'Fault', 'quorumChange', 'change', '']) {
      t.throws(() => surface[method](event, noop), { name: 'TypeError', message: `unknown event ${JSON.stringify(event)}: a surface emits 'fault', 'quorum' and 'error'` }, `${method}(${JSON.stringify(event)})`)
    }
  }
  t.equal(surface.eventNames().length, 0, 'a refused listener is not registered')
  // Removing one, or emitting, under such a name would do nothing, silently: refused too.
  for (const method of ['off', 'removeListener', 'emit']) {
    for (const event of ['faults', 'Fault']) {
      t.throws(() => surface[method](event, noop), { name: 'TypeError', message: `unknown event ${JSON.stringify(event)}: a surface emits 'fault', 'quorum' and 'error'` }, `${method}(${JSON.stringify(event)})`)
    }
  }
  surface.on('fault', noop)
  surface.off('fault', noop)
  t.equal(surface.listenerCount('fault'), 0, 'off() of a known event removes the listener')
  for (const method of ['on', 'once', 'addListener', 'prependListener', 'prependOnceListener']) {
    for (const event of ['fault', 'quorum', 'error', 'newListener', 'removeListener', require('node:events').errorMonitor]) {
      t.doesNotThrow(() => surface[method](event, noop), `${method}(${String(event)})`)
    }
  }
  // emit() of a payload of another shape than the surface's own: refused, no listener called (a
  // listener of 'fault' read f.code of a 1, and crashed or counted nothing).
  let heard = 0
  const count = () => heard++
  for (const event of ['fault', 'quorum', 'error']) surface.on(event, count)
  for (const [event, payload, message] of [
    ['fault', 1, /emit\('fault', …\) takes a fault record .*got 1$/],
    ['fault', { code: 'X' }, /takes a fault record/],
    ['fault', null, /got null$/],
    ['quorum', 'read_only', /emit\('quorum', …\) takes a quorum change .*got the string "read_only"$/],
    ['quorum', { from: 0, to: 3 }, /takes a quorum change/],
    ['error', 'boom', /emit\('error', …\) takes an Error, got the string "boom"$/],
  ]) {
    t.throws(() => surface.emit(event, payload), { name: 'TypeError', message }, `emit(${JSON.stringify(event)}, ${JSON.stringify(payload)})`)
  }
  t.equal(heard, 0, 'no listener was called')
  surface.emit('fault', { code: 'DLQ_WITHOUT_DROP', metric: 'mq_topic_messages_dlq_total', labels: { topic: 't' }, previous: 0, attempted: 1, at: 'now' })
  surface.emit('quorum', { from: 0, to: 1, replicas: 3, inSync: 2, lagging: null, at: 'now' })
  surface.emit('error', new Error('bridged'))
  t.equal(heard, 3, 'payloads of the surface\'s own shapes are emitted')
  for (const event of ['fault', 'quorum', 'error']) surface.off(event, count)
  // events.once() (an 'error' listener beside the one asked for) works and sees the event.
  const change = require('node:events').once(surface, 'quorum')
  surface.replicationRound({ replicas: 3, inSync: 1 })
  const [event] = await change
  t.match(event, { from: 0, to: 2, replicas: 3, inSync: 1 })
})
