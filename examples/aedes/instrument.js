'use strict'
// The glue between aedes and mq-metrics (docs/integration.md walks through it). One mq-metrics
// topic per MQTT topic (partition 0), one group per client subscribed to it by exact name. A message
// is appended when the broker takes it, before any copy is forwarded; aedes' packet counter leads
// every copy back to its seq until every group has settled it. QoS 0 and 1; wildcards are not counted.
const STATE = Symbol.for('mq-metrics') // on aedes' client objects of clean sessions
const GROUP = { from: 'latest', max_in_flight: 65535, settle_window: 65536 } // MQTT: ≤ 65,535 packet ids per client

function instrument(broker, surface) {
  const topics = new Map() // MQTT topic → { handle, counters, base, groups: client id → { g, start, qos, gone, last } }
  const owned = new Map() // client id → the topics it has a group on
  // counters: aedes' counters of the topic's messages not yet settled by every group, increasing;
  // the message at index i has seq base + i (append() numbers a partition's messages one by one).
  const topicOf = (name) => topics.get(name) ?? (topics.size < surface.config.max_topics ? register(name) : undefined) // full: no throw per publish
  const register = (name) => limited(() => { const handle = surface.topic(name); return topics.set(name, { handle, counters: [], base: handle.lastSeq(0) + 1, groups: new Map() }).get(name) })
  const limited = (registration) => { try { return registration() } catch (error) { if (error.code !== 'LIMIT_REACHED') throw error } } // past max_topics or max_groups_per_topic: not counted
  const seqOf = (t, counter) => { // binary search; a copy forwarded as it is published is the newest: tried first
    const c = t.counters
    let lo = c[c.length - 1] === counter ? c.length - 1 : 0, hi = c.length - 1
    while (lo < hi) { const mid = (lo + hi) >> 1; if (c[mid] < counter) lo = mid + 1; else hi = mid }
    return c[lo] === counter ? t.base + lo : undefined
  }
  const counted = (name) => name.charCodeAt(0) !== 36 // '$SYS/…' is the broker's own
  const sweep = (t) => { // forget the messages every group has settled
    let floor = t.handle.lastSeq(0)
    for (const { g } of t.groups.values()) floor = Math.min(floor, g.floor(0))
    if (floor >= t.base) t.counters.splice(0, floor - t.base + 1), (t.base = floor + 1)
  }

  const publish = broker.publish
  broker.publish = function (packet, client, done) {
    const t = !packet.brokerCounter && counted(packet.topic) ? topicOf(packet.topic) : undefined
    if (t !== undefined) {
      const p = packet.payload
      const seq = t.handle.append(0, typeof p === 'string' ? Buffer.byteLength(p) : p?.length ?? 0) // 0: refused (read_only), not counted
      if (seq !== 0) t.counters.push(this.counter + 1) // the counter aedes gives its copy of the packet, next
      if (seq % 1024 === 0) sweep(t)
    }
    return publish.call(this, packet, client, done)
  }
  const forward = broker.authorizeForward
  broker.authorizeForward = function (client, packet) {
    const out = forward.call(this, client, packet)
    if (!out) return out
    const s = client[STATE] // a clean session's
    if (s !== undefined && packet.messageId) return (s.next = client._nextId), out // a discarded session's queue
    const t = packet.retain ? undefined : topics.get(packet.topic)
    const m = t?.groups.get(client.id)
    const zero = packet.qos === 0 || s?.zero === packet // aedes sends it with no packet id (to a QoS 0 subscription)
    const id = s !== undefined && !zero ? s.next : 0 // and numbers a clean session's other copies in this order
    if (id !== 0) s.next = id === 65535 ? 1 : id + 1
    const seq = m && seqOf(t, packet.brokerCounter)
    if (m === undefined || seq === undefined || seq <= m.start) return out // not ours, or from before the subscription
    const again = packet.messageId || m.last === seq // perhaps sent before: a persistent session's queue, or a taken-over connection's twin
    if (again && m.g.isInFlight(0, seq)) m.g.redeliver(0, seq), id !== 0 && s.sent.push(-id, m, seq)
    else if (again && m.g.isSettled(0, seq)) return out // settled already (a QoS 0 copy aedes kept queued, a twin's): counted once
    else if (zero || m.qos === 0) m.g.settle(0, seq, 'delivered') // sent at QoS 0: no acknowledgement will come
    else m.g.send(0, seq), id !== 0 && s.sent.push(-id, m, seq) // −id: never equal to a seq
    m.last = seq
    return out
  }
  const clear = broker.persistence.outgoingClearMessageId.bind(broker.persistence)
  broker.persistence.outgoingClearMessageId = function (client, packet, done) { // a PUBACK
    const s = packet.cmd === 'puback' ? client[STATE] : undefined // a clean session's: aedes keeps no packet for it
    if (s === undefined) return clear(client, packet, packet.cmd === 'puback' ? (err, stored) => (acked(client, stored), done(err, stored)) : done)
    const at = s.sent.indexOf(-packet.messageId, s.head) // acks come in order: at the head
    if (at >= 0) {
      const m = s.sent[at + 1], seq = s.sent[at + 2]
      if (at === s.head) s.head += 3; else s.sent.splice(at, 3)
      if (s.head >= 192 && s.head * 2 >= s.sent.length) (s.sent = s.sent.slice(s.head)), (s.head = 0) // keep it small (slice: copyWithin is slow)
      if (!m.gone) m.g.settle(0, seq, 'delivered')
    }
    return clear(client, packet, done)
  }
  const acked = (client, packet) => { // a persistent session's PUBACK: aedes hands back the stored packet
    const t = packet?.cmd === 'publish' ? topics.get(packet.topic) : undefined
    const m = t?.groups.get(client.id), seq = m && seqOf(t, packet.brokerCounter)
    if (seq > m?.start && m.g.isInFlight(0, seq)) m.g.settle(0, seq, 'delivered') // once
  }
  // Subscribing registers the group before aedes routes anything to it (authorizeSubscribe runs first).
  const authorize = broker.authorizeSubscribe
  broker.authorizeSubscribe = function (client, sub, done) {
    return authorize.call(this, client, sub, (err, ok) => {
      const t = !err && ok && counted(ok.topic) && !/[+#]/.test(ok.topic) ? topicOf(ok.topic) : undefined
      const m = t?.groups.get(client.id)
      const g = m === undefined && t !== undefined ? limited(() => t.handle.group(client.id, GROUP)) : undefined
      if (m !== undefined) m.qos = ok.qos // subscribed again: only the QoS may change
      else if (g !== undefined) {
        t.groups.set(client.id, { g, start: g.floor(0), qos: ok.qos, gone: false, last: 0 })
        ;(owned.get(client.id) ?? owned.set(client.id, new Set()).get(client.id)).add(ok.topic)
      }
      done(err, ok)
    })
  }
  const end = (id, names) => { // the subscription ends: what it still owed is given up on, its group leaves
    for (const name of names) {
      const t = topics.get(name)
      const m = t?.groups.get(id)
      if (m === undefined) continue
      if (m.g.floor(0) < t.handle.lastSeq(0)) m.g.settleUpTo(0, t.handle.lastSeq(0), 'dropped')
      t.handle.removeGroup(id), t.groups.delete(id), owned.get(id).delete(name), (m.gone = true)
    }
    if (owned.get(id)?.size === 0) owned.delete(id)
  }
  broker.on('client', (client) => { // a clean session, before it can subscribe: its copies in flight, and which have no id
    if (!client.clean) return
    const state = (client[STATE] = { next: client._nextId, sent: [], head: 0, zero: undefined }), deliver0 = client.deliver0
    client.deliver0 = (packet, cb) => { state.zero = packet; deliver0(packet, cb); state.zero = undefined } // QoS 0 subscriptions'
  })
  broker.on('unsubscribe', (names, client) => end(client.id, names.filter((name) => !client.subscriptions[name]))) // not subscribed again meanwhile
  // A clean session discards the one before it, and its own when it ends: subscriptions and queue.
  broker.on('clientReady', (client) => { if (client.clean) end(client.id, [...(owned.get(client.id) ?? [])]) })
  broker.on('clientDisconnect', (client) => { if (client.clean) end(client.id, [...(owned.get(client.id) ?? [])]) })
  return { pending: () => [...topics.values()].reduce((n, t) => n + t.counters.length, 0), sweep: () => topics.forEach(sweep), clients: () => owned.size }
}

module.exports = { instrument }
