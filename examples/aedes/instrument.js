'use strict'
// The glue between aedes and mq-metrics (docs/integration.md walks through it). One mq-metrics
// topic per MQTT topic (partition 0), one group per subscriber of it (its client id). A message is
// appended the first time the broker shows it, before any copy of it is forwarded; its seq is
// kept under aedes' own packet counter until every group has settled it.
const SYS = /^\$SYS\//

function instrument(broker, surface) {
  const seqs = new Map() // aedes brokerCounter → { topic, seq }
  const owners = new Map() // MQTT topic → Set of client ids with a group on it
  const seqOf = (packet) => {
    let entry = seqs.get(packet.brokerCounter)
    if (entry === undefined) {
      entry = { topic: packet.topic, seq: surface.topic(packet.topic).append(0, packet.payload.length) }
      seqs.set(packet.brokerCounter, entry)
    }
    return entry.seq
  }
  const owns = (topic, id) => owners.get(topic)?.has(id) === true
  const group = (topic, id) => {
    if (!owns(topic, id)) (owners.get(topic) ?? owners.set(topic, new Set()).get(topic)).add(id)
    return surface.topic(topic).group(id, { from: 'latest', max_in_flight: 65536 })
  }
  const sweep = () => { // forget the seqs every group has settled
    for (const [counter, { topic, seq }] of seqs) {
      const floors = [...(owners.get(topic) ?? [])].map((id) => surface.topic(topic).group(id).floor(0))
      if (floors.every((floor) => floor >= seq)) seqs.delete(counter)
    }
  }
  let published = 0

  const forward = broker.authorizeForward
  broker.authorizeForward = function (client, packet) {
    const out = forward.call(this, client, packet)
    if (!out || SYS.test(packet.topic) || packet.retain) return out
    const seq = seqOf(packet)
    const g = group(packet.topic, client.id)
    if (g.isInFlight(0, seq)) g.redeliver(0, seq) // sent before, not acknowledged: a resend
    else if (Math.min(packet.qos, client.subscriptions[packet.topic]?.qos ?? packet.qos) === 0) g.settle(0, seq, 'delivered')
    else g.send(0, seq)
    if (client.clean && packet.qos > 0) ids(client).set(nextId(client, packet), { topic: packet.topic, seq }) // see below
    return out
  }
  // A clean session's PUBACK names only a packet id, which aedes keeps nowhere: the id its next
  // QoS packet for the client will take (aedes numbers them in forwarding order) is noted instead.
  const sent = new WeakMap() // client → { next, seqs: Map packet id → { topic, seq } }
  const ids = (client) => sent.get(client)?.seqs ?? sent.set(client, { next: client._nextId, seqs: new Map() }).get(client).seqs
  const nextId = (client, packet) => {
    const s = sent.get(client) ?? (ids(client), sent.get(client))
    const id = packet.messageId || s.next
    if (!packet.messageId) s.next = s.next >= 65535 ? 1 : s.next + 1
    return id
  }
  const clear = broker.persistence.outgoingClearMessageId.bind(broker.persistence)
  broker.persistence.outgoingClearMessageId = function (client, packet, done) {
    const seqs = client.clean ? sent.get(client)?.seqs : undefined
    const message = seqs?.get(packet.messageId)
    if (message !== undefined && packet.cmd === 'puback') {
      seqs.delete(packet.messageId)
      if (owns(message.topic, client.id)) group(message.topic, client.id).settle(0, message.seq, 'delivered')
    }
    return clear(client, packet, done)
  }
  // Appended as the broker takes it, before any copy is forwarded: aedes' counter is given to the
  // message here (its packets keep the one they are given) so that every copy finds its seq.
  const publish = broker.publish
  broker.publish = function (packet, client, done) {
    if (!SYS.test(packet.topic) && !packet.brokerCounter) {
      packet.brokerCounter = ++this.counter
      seqOf(packet)
      if (++published % 1024 === 0) sweep()
    }
    return publish.call(this, packet, client, done)
  }
  broker.on('ack', (packet, client) => {
    if (packet === undefined) return // a clean session's: settled in outgoingClearMessageId above
    const entry = seqs.get(packet.brokerCounter)
    if (entry !== undefined && packet.cmd === 'publish' && owns(entry.topic, client.id)) group(entry.topic, client.id).settle(0, entry.seq, 'delivered')
  })
  const end = (id, topics) => { // what the subscription still owed is given up on; its group leaves
    for (const topic of topics.filter((x) => owns(x, id))) {
      const last = surface.topic(topic).lastSeq(0)
      const g = group(topic, id)
      if (g.floor(0) < last) g.settleUpTo(0, last, 'dropped')
      surface.topic(topic).removeGroup(id)
      owners.get(topic).delete(id)
    }
  }
  broker.on('subscribe', (subs, client) => { for (const s of subs) if (!/[+#]/.test(s.topic)) group(s.topic, client.id) })
  broker.on('unsubscribe', (topics, client) => end(client.id, topics))
  // A clean session discards the one before it: its subscriptions and the messages queued for it.
  broker.on('clientReady', (client) => { if (client.clean) end(client.id, [...owners.keys()]) })
  broker.on('clientDisconnect', (client) => { if (client.clean) end(client.id, [...owners.keys()]) })
  return { sweep, pending: () => seqs.size }
}

module.exports = { instrument }
