'use strict'
// The glue between aedes and mq-metrics (docs/integration.md walks through it). One mq-metrics
// topic per MQTT topic (partition 0), one group per client subscribed to it by exact name. A message
// is appended when the broker takes it, before any copy is forwarded; aedes' packet counter leads
// every copy back to its seq until every group has settled it. QoS 0, 1 and 2 (a QoS 2 copy settles at
// its PUBREC in a persistent session, its PUBCOMP in a clean one); wildcard subscriptions are not counted.
const { finished, pipeline, Transform } = require('node:stream')
const STATE = Symbol.for('mq-metrics') // on aedes' client objects of clean sessions
const ZERO = Symbol('mq-metrics QoS 0') // on every client: the packet its deliver0 sends now (no packet id)
const NUMBERED = Symbol('mq-metrics numbered') // on a persistent session's client: packet id → [group, seq, …] of the QoS 1 copies it numbered, oldest first, until their PUBACKs
const EXACTLY = Symbol('mq-metrics exactly') // the same for its QoS 2 copies, until their PUBRECs
const FIRST = Symbol('mq-metrics first id') // the first packet id aedes gives on this connection: from it to client._nextId, its own
const BEFORE = Symbol('mq-metrics before') // on a persistent session's client: the EXACTLY notes of the connection before it
const ORPHANED = Symbol('mq-metrics orphaned') // [group, seq, …]: copies aedes cleared for another's acknowledgement while their own may still come on this connection
const NAME_MAX = 1024 // the library's longest name; longer MQTT topics and client ids are not counted

// window: seqs a group tracks above its floor (2 bits each: 16 KiB per group by default). A copy
// still not acknowledged once its topic is ¾ window messages further on is given up (dropped).
// idle: ms after which a topic nobody subscribes to and nobody has published to leaves (its series
// with it; published again, it starts from 0), checked every idle/4 ms (so it goes within 1.25 × idle): dynamic topics (a device's
// own) do not pile up until max_topics. 0: they stay.
function instrument(broker, surface, { window: WINDOW = 65536, idle: IDLE = 5 * 60_000 } = {}) {
  if (!Number.isInteger(WINDOW / 32) || WINDOW < 64 || WINDOW > 131072) throw new RangeError(`window must be a multiple of 32 from 64 to 131072 (the library's largest settle_window), got ${WINDOW}`)
  if (!Number.isInteger(IDLE) || IDLE < 0 || IDLE / 4 > 2 ** 31 - 1) throw new RangeError(`idle must be a number of ms from 0 to ${4 * (2 ** 31 - 1)} (a timer's longest period, 4 times), got ${IDLE}`)
  const KEEP = WINDOW * 0.75
  const GROUP = { from: 'latest', max_in_flight: 65535, settle_window: WINDOW } // MQTT: ≤ 65,535 packet ids per client
  const topics = new Map() // MQTT topic → { name, handle, counters, base, groups: client id → group state, dark, routing }
  const owned = new Map() // client id → the topics it has a group on
  const latest = new Map() // persistent client id → the EXACTLY notes of its latest connection that made some
  // Another node's wills published here (aedes' checkAndPublish): their copies are this node's to
  // count. Per topic (t.wills: aedes counter → that node's id) until every group has settled them.
  const willing = new Set() // the topics that keep some
  const idle = new Set() // topics without a group, oldest first: one leaves for a subscription's topic at max_topics, or once unused for IDLE ms
  let tick = 0 // quarters of IDLE passed: a topic without a group holds the tick of its last use (t.used)
  // counters: aedes' counters of the topic's messages not yet settled by every group, increasing;
  // the message at index i has seq base + i (append() numbers a partition's messages one by one).
  const topicOf = (name, subscribing) => topics.get(name) ?? (name.length !== 0 && name.length <= NAME_MAX && (topics.size < surface.config.max_topics || (subscribing && evict())) ? register(name) : undefined) // full: no throw per publish
  const register = (name) => limited(() => { const handle = surface.topic(name); idle.add(name); return topics.set(name, { name, handle, counters: [], base: handle.lastSeq(0) + 1, groups: new Map(), dark: new Set(), routing: new Map(), persistent: 0, used: tick, wills: undefined }).get(name) })
  const reap = () => { // the topics without a group unused for IDLE ms leave
    tick++
    willing.forEach(sweep) // a will given up on by a group's window, on a quiet topic
    for (const name of idle) { const t = topics.get(name); if (tick - t.used > 4 && limited(() => surface.removeTopic(name)) === true) idle.delete(name), topics.delete(name) }
  }
  if (IDLE > 0) {
    const timer = setInterval(() => { try { reap() } catch (error) { if (error.code !== 'SURFACE_CLOSED') throw error; clearInterval(timer) } }, IDLE / 4).unref() // a surface closed before the broker: nothing more to remove
    broker.once('closed', () => clearInterval(timer))
  }
  const evict = () => { for (const name of idle) return limited(() => surface.removeTopic(name)) === true && (idle.delete(name), topics.delete(name)); return false }
  // Past max_topics, max_groups_per_topic or what the registration log holds, the library refuses
  // (LIMIT_REACHED, nothing changed): what it refused is not counted, and the broker goes on.
  // Paths taken per message (append, forward, acknowledgement) catch it inline: no closure per call.
  const limited = (call) => { try { return call() } catch (error) { if (error.code !== 'LIMIT_REACHED') throw error } }
  const seqOf = (t, counter) => { // binary search; a copy forwarded as it is published is the newest: tried first
    const c = t.counters
    let lo = c[c.length - 1] === counter ? c.length - 1 : 0, hi = c.length - 1
    while (lo < hi) { const mid = (lo + hi) >> 1; if (c[mid] < counter) lo = mid + 1; else hi = mid }
    return c[lo] === counter ? t.base + lo : undefined
  }
  const counted = (name) => name.charCodeAt(0) !== 36 // '$…' topics are the broker's own ($SYS/…; MQTT 3.1.1 §4.7.2)
  const sweep = (t) => { // forget the messages every group has settled
    let floor = t.handle.lastSeq(0)
    for (const { g } of t.groups.values()) floor = Math.min(floor, g.floor(0))
    if (floor >= t.base) t.counters.splice(0, floor - t.base + 1), (t.base = floor + 1)
    if (t.wills !== undefined) for (const counter of t.wills.keys()) if (!(counter >= t.counters[0])) t.wills.delete(counter), t.wills.size === 0 && ((t.wills = undefined), willing.delete(t)) // settled by every group
  }
  // A group's seqs up to m.lost are not its to count any more: before its subscription, given up, or all once it ended.
  const room = (m, seq) => { // keeps seq within the group's window (checked every WINDOW − KEEP seqs); true: the group left
    if (seq < m.check) return false
    if (m.g.floor(0) < seq - KEEP) m.g.settleUpTo(0, seq - KEEP, 'dropped'), (m.lost = Math.max(m.lost, seq - KEEP))
    m.check = seq + WINDOW - KEEP
    return m.ending && m.g.inFlight() === 0 && (leave(m), true) // its last copy in flight given up
  }
  const drop = (m, seq) => limited(() => room(m, seq) || m.g.settle(0, seq, 'dropped')) // a copy the group will never be sent
  const ours = (packet) => packet.brokerId === broker.id || (willing.size !== 0 && topics.get(packet.topic)?.wills?.get(packet.brokerCounter) === packet.brokerId) // not: another node's message (a cluster), counted there
  const groupOf = (client, packet) => (ours(packet) ? topics.get(packet.topic)?.groups.get(client.id) : undefined)
  const acked = (m, seq, outcome) => { // a copy in flight is acknowledged (or can no longer be)
    try {
      if (seq > m.lost) m.g.settle(0, seq, outcome)
    } catch (error) {
      if (error.code !== 'LIMIT_REACHED') throw error // its first settlement, with no room for its window
    }
    if (m.ending && m.g.inFlight() === 0) leave(m)
    if (m.t.wills !== undefined) sweep(m.t) // perhaps another node's will, settled by its last group now
  }

  const appended = (t, bytes) => {
    try {
      return t.handle.append(0, bytes)
    } catch (error) {
      if (error.code !== 'LIMIT_REACHED') throw error
      return 0
    }
  }
  const publish = broker.publish
  broker.publish = function (packet, client, done) {
    if (typeof client === 'function') (done = client), (client = null)
    const t = !surface.closed && !packet.brokerCounter && counted(packet.topic) ? topicOf(packet.topic) : undefined // closed before the broker: nothing more is counted
    if (t !== undefined) {
      const p = packet.payload
      const seq = appended(t, typeof p === 'string' ? Buffer.byteLength(p) : p?.length ?? 0) // 0: refused (read_only, or no room for the partition), not counted
      const will = seq !== 0 && !!packet.brokerId && packet.brokerId !== this.id && t.groups.size !== 0 // another node's
      if (seq !== 0 && (t.groups.size !== 0 || t.counters.length !== 0)) t.counters.push(this.counter + 1) // the counter aedes gives its copy of the packet, next
      else if (seq !== 0) (t.base = seq + 1), (t.used = tick) // no group to settle it: nothing to keep
      if (will) (t.wills ??= new Map()).set(this.counter + 1, packet.brokerId), willing.add(t)
      if (client?.closed && !client.clean) away(client) // its will: aedes publishes it before 'clientDisconnect'
      if (seq !== 0 && (t.dark.size !== 0 || will || (t.persistent !== 0 && (packet.qos > 0 || packet.retain)))) done = routed(t, seq, done, will) // a store to wait for: a persistent session may go away meanwhile
      if (seq % 64 === 0) sweep(t)
    }
    return publish.call(this, packet, client, done)
  }
  const routed = (t, seq, done, will) => { // once aedes has routed the message, a group away that got no copy, sent or stored, never will
    // away when it was published (back meanwhile: its restored subscription came too late for it; a
    // retained message's copy sent on a SUBSCRIBE is aedes' own, not this one), or away when it was
    // routed. Any group for another node's will: aedes skips the copy of a subscriber that has had a
    // message of that node's with a higher counter (its duplicate check), and the will carries this node's.
    const stored = [], away = will ? [...t.groups.values()] : [...t.dark]
    t.routing.set(seq, stored)
    return (err) => {
      t.routing.delete(seq)
      if (!surface.closed) for (const groups of [away, t.dark]) for (const m of groups) if (m.last !== seq && seq > m.lost && !m.g.isInFlight(0, seq) && !m.g.isSettled(0, seq)) stored.includes(m.id) ? (m.unsubscribing || (m.offline && seq <= m.offlineAt)) && (m.kept ??= new Set()).add(seq) : drop(m, seq) // kept: stored for it while its UNSUBSCRIBE waits, or before it went and routed after
      if (will && !surface.closed && topics.get(t.name) === t) sweep(t) // not a topic removed meanwhile (idle, its last group gone)
      done?.(err)
    }
  }
  const enqueue = broker.persistence.outgoingEnqueueCombi.bind(broker.persistence)
  broker.persistence.outgoingEnqueueCombi = function (subs, packet, done) { // a QoS 1 or 2 message stored for the persistent sessions that get a copy
    const t = subs?.length && ours(packet) ? topics.get(packet.topic) : undefined // aedes calls it for every message: most store no copy
    const stored = t?.routing.size ? t.routing.get(seqOf(t, packet.brokerCounter)) : undefined // routed() is waiting for it
    if (stored !== undefined) for (const sub of subs) stored.push(sub.clientId) // an offline session's copy is sent when it is back
    return enqueue(subs, packet, subs?.length ? (err) => (err && failed(packet), done(err)) : done)
  }
  const retain = broker.persistence.storeRetained.bind(broker.persistence)
  broker.persistence.storeRetained = (packet, done) => retain(packet, (err) => (err && failed(packet), done(err)))
  const failed = (packet) => { // a durable store failed as aedes took the message: aedes routes it to no one
    const t = !surface.closed && ours(packet) ? topics.get(packet.topic) : undefined, seq = t && seqOf(t, packet.brokerCounter)
    if (seq !== undefined) for (const m of t.groups.values()) if (m.owed?.delete(seq)) acked(m, seq, 'dropped'); else if (seq > m.lost && !m.g.isInFlight(0, seq) && !m.g.isSettled(0, seq)) drop(m, seq)
  }
  const update = broker.persistence.outgoingUpdate.bind(broker.persistence)
  broker.persistence.outgoingUpdate = function (client, packet, done) { // a persistent session's copy numbered before it is sent
    if (surface.closed) return update(client, packet, done)
    if (packet.cmd === 'pubrel' && packet.brokerId === undefined) received(client, packet.messageId) // or its PUBREC: aedes stores the PUBREL in the QoS 2 copy's place (a stored one replayed on reconnect is a packet of aedes', numbered by a broker)
    if (client[STATE] !== undefined) numbered(client[STATE], packet) // a clean session's: the queue of the one it discards, each in the order read
    return update(client, packet, (err, c, p) => {
      // 'no such packet': aedes lost the copy (it cleared another's by mistake), never sent
      if (!surface.closed && p?.cmd === 'publish') err ? err.message === 'no such packet' ? lost(client, p) : twin(client, p, false) : (twin(client, p, true), p.qos > 0 && noted(client, p, p.qos === 2 ? EXACTLY : NUMBERED)) // another error (a durable store's): the copy stays stored, replayed
      done(err, c, p)
    })
  }
  const forward = broker.authorizeForward
  broker.authorizeForward = function (client, packet) {
    const out = forward.call(this, client, packet)
    if (surface.closed) return out
    if (!out) return client.clean || packet.qos === 0 || client[ZERO] === packet ? refused(client, packet) : undefined, out // a persistent session's QoS 1 or 2 copy: at the clear that follows (kept())
    const s = client[STATE] // a clean session's
    if (s !== undefined && packet.messageId) return out // a discarded session's queue (numbered())
    const zero = packet.qos === 0 || client[ZERO] === packet // aedes sends it with no packet id (to a QoS 0 subscription)
    const id = s !== undefined && !zero ? s.next : 0 // and numbers a clean session's other copies in this order
    if (id !== 0) (s.next = id === 65535 ? 1 : id + 1), s.sent[s.head] === -id && reused(s) // its id taken again: that copy cannot be acknowledged now
    try {
      forwarded(client, packet, s, id, zero)
    } catch (error) {
      if (error.code !== 'LIMIT_REACHED') throw error // the group's first copy, with no room for its window: not counted
    }
    return out
  }
  const forwarded = (client, packet, s, id, zero) => { // counts a copy aedes forwards
    const m = groupOf(client, packet)
    const seq = m && seqOf(m.t, packet.brokerCounter)
    if (m === undefined || seq === undefined || seq <= m.lost || room(m, seq)) return // not ours, from before the subscription, or given up
    const again = !m.clean || packet.messageId || m.last === seq || seq <= m.cut // perhaps sent before: a persistent session's (its queue replayed, a live twin of a copy stored before it), a taken-over connection's twin; or dropped at an UNSUBSCRIBE
    if (again && m.g.isInFlight(0, seq)) m.owed?.delete(seq) || (s === undefined && !packet.messageId && !packet.retain && !zero ? (m.twins ??= new Set()).add(packet.brokerCounter) : m.g.redeliver(0, seq)), id !== 0 && s.sent.push(-id, m, seq) // owed: in flight since an UNSUBSCRIBE, sent now; a live twin: see twin()
    else if (m.ending || (again && m.g.isSettled(0, seq))) return // settled already (a QoS 0 copy aedes kept queued, a twin's; or, its subscription ending, a wildcard's copy): counted once
    else if (zero || m.qos === 0) m.g.settle(0, seq, 'delivered') // sent at QoS 0 (aedes sends at most at the subscription's QoS): no acknowledgement will come
    else m.g.send(0, seq), id !== 0 && s.sent.push(-id, m, seq) // −id: never equal to a seq
    m.last = seq
  }
  // aedes numbers a discarded session's queued copy with the clean session's next packet id (unless
  // it came numbered: noted as the queue is read, one flag per item in order, as aedes takes them),
  // then stores it (outgoingUpdate) before it reaches authorizeForward: every copy forwarded but not
  // numbered yet, whose ids the glue took from that id on (counted or not), takes the id after its own.
  const stream = broker.persistence.outgoingStream.bind(broker.persistence)
  broker.persistence.outgoingStream = function (client) { // read as a clean session starts: the queue of the one it discards
    const s = client[STATE]
    if (s === undefined) return stream(client)
    return pipeline(stream(client), new Transform({ objectMode: true, transform (packet, _, next) { s.fresh.push(!packet.messageId); next(null, packet) } }), () => {})
  }
  const numbered = (s, packet) => {
    const fresh = s.fresh[s.read++]
    if (s.read >= s.fresh.length) (s.fresh.length = 0), (s.read = 0)
    if (fresh !== true || packet.cmd !== 'publish') return // it came numbered
    const id = packet.messageId, next = (n) => (n === 65535 ? 1 : n + 1), end = s.next
    const waiting = (n) => (id <= end ? n >= id && n < end : n >= id || n < end) // ids from the one it took to the glue's next
    for (let i = s.head; i < s.sent.length; i += 3) if (waiting(-s.sent[i])) s.sent[i] = -next(-s.sent[i])
    s.next = next(s.next)
  }
  const refused = (client, packet, cleared, own) => { // aedes keeps this copy back (the broker's own authorizeForward, or its duplicate check): never sent (own: its stored copy cleared)
    const m = groupOf(client, packet), seq = m && seqOf(m.t, packet.brokerCounter)
    if (cleared && seq > m?.lost && m.g.isInFlight(0, seq)) return acked(m, seq, 'dropped') // cleared: a persistent session's stored copy refused as aedes replays it, sent before perhaps; never sent again
    if (!own && m !== undefined && m.client !== client && !m.client.closed) return // a connection taken over: the live one's copy tells
    if (seq > m?.lost && !m.ending && !m.g.isInFlight(0, seq) && !m.g.isSettled(0, seq)) drop(m, seq)
  }
  // aedes clears the stored copy of one it does not send by its packet id (numbered: as its queue is replayed, and then cleared for
  // good). A live copy has none: aedes clears the first copy stored with none, perhaps another message's, which it then never sends,
  // while this one stays stored and is sent on a later connection.
  const kept = (client, packet, copy) => {
    const same = copy?.cmd === 'publish' && copy.brokerId === packet.brokerId && copy.brokerCounter === packet.brokerCounter
    if (same || copy?.cmd !== 'publish' || packet.messageId !== undefined) return refused(client, packet, !client.clean && packet.messageId !== undefined, same) // same: out of the store, whichever connection is live now
    const m = groupOf(client, copy), seq = m && seqOf(m.t, copy.brokerCounter) // another message's copy, never numbered: never sent (in flight: forwarded, not numbered yet; its own 'no such packet' or PUBACK tells)
    if (seq > m?.lost && !m.ending && !m.g.isInFlight(0, seq) && !m.g.isSettled(0, seq)) drop(m, seq)
  }
  const gone = (client, p) => { // a persistent session's stored copy aedes will never send
    const m = groupOf(client, p), seq = m && seqOf(m.t, p.brokerCounter)
    if (seq > m?.lost && m.g.isInFlight(0, seq)) acked(m, seq, 'dropped'); else if (seq > m?.lost && !m.ending && !m.g.isSettled(0, seq)) drop(m, seq)
  }
  const reused = (s) => { const m = s.sent[s.head + 1], seq = s.sent[s.head + 2]; shift(s); acked(m, seq, 'dropped') }
  const shift = (s) => { // the FIFO's head is done with; the done part is sliced away once large (copyWithin is slow)
    s.head += 3
    if (s.head >= 192 && s.head * 2 >= s.sent.length) (s.sent = s.sent.slice(s.head)), (s.head = 0)
  }
  const clear = broker.persistence.outgoingClearMessageId.bind(broker.persistence)
  broker.persistence.outgoingClearMessageId = function (client, packet, done) { // a PUBACK, or a QoS 2 copy's PUBCOMP
    if (surface.closed) return clear(client, packet, done)
    if (packet.cmd === 'publish') return clear(client, packet, (err, copy) => (surface.closed || kept(client, packet, copy), done(err, copy))) // a persistent session's copy aedes stored and then did not send (its duplicate check, or authorizeForward)
    const s = packet.cmd === 'puback' || packet.cmd === 'pubcomp' ? client[STATE] : undefined // a clean session's: aedes keeps no packet for it
    if (s === undefined && packet.cmd === 'pubcomp') return clear(client, packet, (err, copy) => (surface.closed || copy?.cmd !== 'publish' || cleared(client, copy), done(err, copy))) // a persistent session's: its copy settled at the PUBREC (a copy aedes clears is another's)
    if (s === undefined && packet.cmd !== 'puback') return clear(client, packet, done)
    if (s === undefined) { // a persistent session's: the oldest copy in flight this connection numbered with that id (a durable store answers late)
      const [m, seq] = take(client[NUMBERED], packet.messageId)
      if (m !== undefined) acked(m, seq, 'delivered')
      return clear(client, packet, (err, copy) => (surface.closed || copy?.cmd !== 'publish' || (m === undefined && !issued(client, packet.messageId) ? settle(client, copy, 'delivered') : cleared(client, copy, m, seq)), done(err, copy))) // aedes hands back the stored copy it cleared
    }
    const at = s.sent.indexOf(-packet.messageId, s.head) // acks come in order: at the head
    if (at >= 0) {
      const m = s.sent[at + 1], seq = s.sent[at + 2]
      if (at === s.head) shift(s); else s.sent.splice(at, 3)
      acked(m, seq, 'delivered')
    }
    return clear(client, packet, done)
  }
  // aedes clears the first stored packet with the acknowledged id: a copy other than the one acknowledged (m, seq; a PUBCOMP's
  // was settled at its PUBREC) is lost, never sent again. Its own acknowledgement may still come on this connection (the replay
  // sent it under that id too): then it is dropped only if the connection ends first.
  const cleared = (client, copy, m, seq) => {
    const n = groupOf(client, copy), at = n && seqOf(n.t, copy.brokerCounter)
    if (!(at > n?.lost) || (n === m && at === seq) || !n.g.isInFlight(0, at)) return
    if (!client.closed && (noting(client[NUMBERED]?.get(copy.messageId), n, at) || noting(client[EXACTLY]?.get(copy.messageId), n, at))) (client[ORPHANED] ??= []).push(n, at)
    else acked(n, at, 'dropped') // (closed: cleared as a durable persistence answers late, nothing more comes on it)
  }
  // A PUBACK or PUBREC no note of its connection matches, under a packet id it did not give (aedes numbers a connection's copies
  // in order from client._nextId), is for a copy an earlier connection sent: mqtt.js queues acknowledgements while it is offline and
  // sends them once connected again. Under an id it gave, it is for a copy the glue does not count (a retained one sent on SUBSCRIBE).
  const issued = (client, id) => { const from = client[FIRST], to = client._nextId; return from === undefined || (from <= to ? id >= from && id < to : id >= from || id < to) }
  const settle = (client, p, outcome) => { const m = groupOf(client, p), seq = m && seqOf(m.t, p.brokerCounter); if (seq > m?.lost && m.g.isInFlight(0, seq)) acked(m, seq, outcome) }
  const orphans = (client) => { const o = client[ORPHANED]; for (let i = 0; i < (o?.length ?? 0); i += 2) if (o[i + 1] > o[i].lost && o[i].g.isInFlight(0, o[i + 1])) acked(o[i], o[i + 1], 'dropped') } // its connection ended first
  const noting = (copies, m, seq) => { for (let i = 0; i < (copies?.length ?? 0); i += 2) if (copies[i] === m && copies[i + 1] === seq) return true; return false }
  // A persistent session's QoS 1 or 2 copy numbered on this connection: noted under its packet id (NUMBERED or EXACTLY) until its
  // PUBACK or PUBREC settles the oldest copy noted under that id still in flight. One id can hold two copies in flight (a new
  // connection's ids start at random, and a replayed copy keeps its own): their acknowledgements come in the order they were numbered.
  const noted = (client, p, key) => {
    const m = groupOf(client, p), seq = m && seqOf(m.t, p.brokerCounter), ids = seq > m?.lost ? (client[key] ??= new Map()) : undefined
    if (ids !== undefined) ids.has(p.messageId) ? ids.get(p.messageId).push(m, seq) : ids.set(p.messageId, [m, seq])
    if (ids !== undefined && key === EXACTLY) latest.set(client.id, ids)
  }
  const take = (ids, id) => { // [group, seq] of the oldest copy in flight noted under `id` (the notes up to it forgotten)
    const copies = ids?.get(id)
    let m, seq
    while (copies?.length > 0) if ((m = copies.shift()), (seq = copies.shift()), seq > m.lost && m.g.isInFlight(0, seq)) break; else m = undefined
    if (copies?.length === 0) ids.delete(id)
    return m === undefined ? [] : [m, seq]
  }
  // 'no such packet': aedes lost the copy (it cleared another's by mistake, or the subscriber acknowledged it before a live twin came), never sent.
  const lost = (client, p) => (twin(client, p, false), gone(client, p))
  // A persistent session's copy in flight routed again (a live twin of a replayed copy) is sent again only if aedes finds it stored.
  const twin = (client, p, sent) => { const m = groupOf(client, p), seq = m?.twins?.delete(p.brokerCounter) && sent ? seqOf(m.t, p.brokerCounter) : undefined; if (seq > m?.lost && m.g.isInFlight(0, seq)) m.g.redeliver(0, seq) }
  // A persistent session's QoS 2 copy is settled at its PUBREC (the subscriber has it), found in the connection's notes: aedes'
  // in-memory store keeps no usable record after it (it relabels a stored PUBREL with the next one's id when two await their PUBCOMP).
  const received = (client, id) => {
    let [m, seq] = take(client[EXACTLY], id)
    if (m === undefined && !issued(client, id)) [m, seq] = take(client[BEFORE], id) // the connection before's copy
    if (m !== undefined) acked(m, seq, 'delivered')
  }
  const preConnect = broker.preConnect
  broker.preConnect = function (client, packet, callback) { // before a persistent session's restored subscriptions take deliver0 and deliverQoS
    const deliver0 = client.deliver0, deliverQoS = client.deliverQoS
    client[ZERO] = undefined
    client[FIRST] = client._nextId
    if (packet.clean) latest.delete(packet.clientId); else client[BEFORE] = latest.get(packet.clientId)
    client.deliver0 = (p, cb) => { skipped(client, p); client[ZERO] = p; deliver0(p, cb); client[ZERO] = undefined } // QoS 0 subscriptions'
    client.deliverQoS = (p, cb) => { skipped(client, p, p.qos > 0); deliverQoS(p, cb) }
    finished(client.conn, () => surface.closed || (orphans(client), client.clean || broker.clients[client.id] === client || away(client))) // lost before aedes registers it (its restored subscriptions live): no 'clientDisconnect' comes
    return preConnect.call(this, client, packet, callback)
  }
  // aedes' duplicate check skips a copy with a counter not above the last of its node this client had (a message
  // overtaken on its way: a durable persistence storing it, or one published from code): a clean session's goes unseen.
  // Before it, no-local skips a bridge's own message (MQTT 3.1.1 bridge mode, as mosquitto's bridges connect).
  const skipped = (client, p, clears) => p.brokerId !== undefined && !surface.closed && (client.clean || !clears) && ((p.nl && p.clientId === client.id) || (client.duplicates[p.brokerId] || 0) >= p.brokerCounter) && refused(client, p) // a persistent session's QoS 1 or 2 copy: at the clear that follows (kept())
  // Subscribing registers the group before aedes routes anything to it (authorizeSubscribe runs
  // first); a persistent session's subscriptions restored on reconnect come through here too.
  const authorize = broker.authorizeSubscribe
  broker.authorizeSubscribe = function (client, sub, done) {
    return authorize.call(this, client, sub, (err, ok) => {
      const dead = surface.closed || broker.closed || (client.closed && client.clean) // aedes drops the subscription of a client gone meanwhile
      const t = !err && ok && !dead && client.id.length <= NAME_MAX && counted(ok.topic) && !/[+#]/.test(ok.topic) ? topicOf(ok.topic, true) : undefined
      let m = t?.groups.get(client.id)
      if (m !== undefined && m.client !== client && (client.clean || m.clean) && !client.closed) leave(m), (m = t.groups.get(client.id)) // the session before a clean one is discarded: its group with it; a clean one's group is not a persistent connection's either
      m ??= t !== undefined ? group(t, client) : undefined
      const stores = !client.clean && client.connackSent // a persistent session's SUBSCRIBE (not a restore): the persistence stores it first
      const held = stores && t !== undefined ? client.subscriptions[ok.topic] : undefined // aedes routes by the subscription it holds until then (ok: null, refused)
      if (m !== undefined && (client === m.client || !client.closed || m.client.closed)) (m.qos = held?.qos ?? ok.qos), (m.client = client), (m.ending = m.unsubscribing = m.discarded = false), (m.storing = stores && held === undefined), dark(m, client.closed) // (subscribed again: only the QoS may change; or restored), not from a lost connection over a live one's
      done(err, ok)
    })
  }
  const group = (t, client) => {
    const g = limited(() => t.handle.group(client.id, GROUP))
    if (g === undefined) return undefined
    const m = { g, t, id: client.id, clean: client.clean, lost: g.floor(0), check: 0, qos: 0, client, last: 0, cut: 0, offline: false, offlineAt: 0, kept: undefined, ending: false, unsubscribing: false, storing: false, discarded: false, owed: undefined, twins: undefined }
    t.groups.set(client.id, m), idle.delete(t.name), m.clean || t.persistent++
    ;(owned.get(client.id) ?? owned.set(client.id, new Set()).get(client.id)).add(t.name)
    return m
  }
  const dark = (m, offline) => { // a group that is sent nothing now: offline, its subscription ending or its UNSUBSCRIBE waiting, or not yet stored
    if (offline !== m.offline) (m.offlineAt = m.t.handle.lastSeq(0)), offline || (m.kept = undefined) // what came before was routed while it was online; back, its queue is replayed
    m.offline = offline
    if (offline || m.ending || m.storing || m.unsubscribing) m.t.dark.add(m); else m.t.dark.delete(m)
  }
  // A clean session discards the one before it once the persistence has cleaned its subscriptions: that session's groups
  // leave then (a connection of it still up: as it goes), for the clean one may be lost before any 'clientReady'.
  const cleanSubs = broker.persistence.cleanSubscriptions.bind(broker.persistence)
  broker.persistence.cleanSubscriptions = function (client, done) {
    return cleanSubs(client, (err, ...rest) => {
      if (!err && !surface.closed) session(client).forEach((m) => m.client !== client && (m.client.closed ? leave(m) : (m.discarded = true)))
      done(err, ...rest)
    })
  }
  // A persistent session's new subscription takes copies once its persistence has stored it (a durable one answers late).
  const store = broker.persistence.addSubscriptions.bind(broker.persistence)
  broker.persistence.addSubscriptions = function (client, subs, done) {
    return store(client, subs, (err, ...rest) => {
      done(err, ...rest) // aedes subscribes now (or, err, not at all)
      if (!surface.closed) for (const { topic } of subs) {
        const m = topics.get(topic)?.groups.get(client.id), sub = client.subscriptions[topic]
        if (m !== undefined && sub !== undefined) m.qos = sub.qos // aedes subscribes in the order the persistence answers: two SUBSCRIBEs of one topic may swap
        if (m?.storing && (err || sub !== undefined)) (m.storing = false), err ? leave(m) : dark(m, m.offline)
      }
    })
  }
  const leave = (m) => { // the group leaves: what it still owes is given up on (a removal the log has no room for: it stays)
    const t = m.t, last = t.handle.lastSeq(0)
    if (limited(() => (m.g.floor(0) < last && m.g.settleUpTo(0, last, 'dropped'), t.handle.removeGroup(m.id))) === undefined) return
    t.groups.delete(m.id), t.dark.delete(m), (m.lost = Infinity), (m.ending = false), m.clean || t.persistent--
    if (t.groups.size === 0) idle.add(t.name), (t.used = tick), (t.base += t.counters.length), (t.counters.length = 0), sweep(t) // nothing of it to keep
    else if (t.wills !== undefined) sweep(t) // it may have owed a will last
    if (owned.get(m.id)?.delete(t.name) && owned.get(m.id).size === 0) owned.delete(m.id), latest.delete(m.id)
  }
  // An unsubscription: the copies in flight may still be acknowledged (MQTT 3.1.1 §3.10.4), the group leaves after them.
  const unsubscribe = (m) => {
    if (m.client.connected === false && !m.client.closed) return void ((m.unsubscribing = true), dark(m, m.offline)) // aedes replays its queue still, this topic's too: after it (what is published meanwhile it neither sends nor stores)
    const last = m.t.handle.lastSeq(0)
    m.unsubscribing = false, (m.cut = last) // what waits in aedes' queue still may reach a subscription taken again: settled already
    const left = limited(() => {
      if (room(m, last)) return true
      for (let seq = Math.max(m.g.floor(0), m.lost) + 1; seq <= last; seq++) if (!m.g.isInFlight(0, seq) && !m.g.isSettled(0, seq)) queued(m, seq) ? (m.g.send(0, seq), (m.owed ??= new Set()).add(seq)) : m.g.settle(0, seq, 'dropped')
      return false
    })
    if (left === true) return
    if (m.g.inFlight() === 0) return leave(m)
    m.ending = true, dark(m, m.offline)
  }
  // A persistent session's copy stored and not sent yet is sent all the same when the session is next back: owed (in
  // flight). Stored for it as aedes routes the message now; or, offline, what routed() left it since it went or kept (the rest it dropped).
  const queued = (m, seq) => !m.clean && (m.t.routing.has(seq) ? m.t.routing.get(seq).includes(m.id) : (m.offline && seq > m.offlineAt) || m.kept?.has(seq) === true)
  const session = (client) => [...(owned.get(client.id) ?? [])].map((name) => topics.get(name).groups.get(client.id))
  broker.on('client', (client) => { if (client.clean) client[STATE] = { next: client._nextId, sent: [], head: 0, fresh: [], read: 0 } }) // a clean session's copies in flight
  const ended = (client, names) => surface.closed || names.forEach((name) => { const m = topics.get(name)?.groups.get(client.id); if (m !== undefined && !m.ending && (m.client === client || m.client.closed)) unsubscribe(m) }) // not a newer connection's
  broker.on('unsubscribe', (names, client) => ended(client, names.filter((name) => !client.subscriptions[name]))) // not subscribed again meanwhile
  const remove = broker.persistence.removeSubscriptions.bind(broker.persistence)
  broker.persistence.removeSubscriptions = function (client, names, done) { // a persistent session's UNSUBSCRIBE
    return remove(client, names, (err) => { if (!err && client.closed) ended(client, names); done(err) }) // closed meanwhile: aedes emits no 'unsubscribe'
  }
  // A clean session discards the one before it, and its own when it ends: subscriptions and queue.
  // 'clientReady' comes once aedes has emptied the session's queue, after the CONNACK: a clean
  // session may have subscribed already (its groups are its own: m.client), and unsubscribed.
  // A persistent session back: aedes has restored its subscriptions (authorizeSubscribe) and replayed its queue; a group still offline was unsubscribed meanwhile (unless a store of its SUBSCRIBE was pending: a takeover does not restore it, aedes queues for it).
  // aedes emits it for a connection already lost too (its queue read by a slow persistence): the next one's tells.
  broker.on('clientReady', (client) => surface.closed || client.closed || session(client).forEach((m) => (client.clean ? (m.client !== client ? leave(m) : m.unsubscribing && unsubscribe(m)) : (m.unsubscribing || (m.offline && !m.ending && !m.storing)) && unsubscribe(m))))
  broker.on('clientDisconnect', (client) => surface.closed || (client.clean ? session(client).forEach((m) => (m.client === client || m.client.closed) && leave(m)) : away(client))) // not a newer connection's
  const away = (client) => session(client).forEach((m) => { // a persistent session goes offline (unless a takeover has restored it already)
    if (m.client === client) m.discarded ? leave(m) : dark(m, true)
  })
  return { pending: () => [...topics.values()].reduce((n, t) => n + t.counters.length, 0), sweep: () => topics.forEach(sweep), clients: () => owned.size, awaitingPubrec: () => Object.values(broker.clients).reduce((n, client) => n + (client[EXACTLY]?.size ?? 0), 0), wills: () => [...willing].reduce((n, t) => n + t.wills.size, 0) }
}

module.exports = { instrument }
