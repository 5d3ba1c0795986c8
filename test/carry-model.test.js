'use strict'
// The carry (design §3.5, docs/metrics.md label rule 4, docs/reclamation.md "Removing one of
// several names of a label: the carry") against a model, on seeded random schedules of threads
// played in this one (helpers.js played(): a main thread, a worker and threads attached late, each
// with its own registry and row over one arena). Six topic names make three labels (a.b, a_b and
// "a b" are a_b; d.e and d_e are d_e; c) and five group names three group labels (g.1, g_1, "g 1";
// h; k). Each step one thread appends, counts in a group, removes a group or a topic, announces
// its epoch, compacts the log, or a thread attaches; or a thread that has done nothing since a
// removal — stopped inside a call begun before it — lands a late write in the removed topic's or
// group's cells. Then threads read /metrics' merged series: in the hardest schedule only some of
// them, so a stale picture replays checkpoints (the log compacted as often as it may be) over
// topics and groups it last saw live.
//
// Every series read must be exactly what the model says. The model is written here from the docs
// alone: a removed name's counters stay in its label's series while a live topic has the label;
// its last_seq only on the partitions a live topic of the label had at the removal and has had
// since; a removed group's retries only for group labels a live group of the label had then and
// since; a series that left comes back from zero; all goes with the label's last live topic; and
// a late write counts exactly where the removed share it lands in still counts. Two checks need no
// model: no counter, last_seq or retries of one series instance ever goes down on any thread, and
// all threads reading at one step agree. If this fails, removing one of several names of a label
// resets a Prometheus counter (or counts a share twice, or keeps one that should have gone), trips
// MqPartitionLastSeqDecreased, or two threads' scrapes disagree. Each failing seed is reported
// with its step, op, label, got and want and the ops before it; `CARRY_MODEL_SEED=<seed>` runs
// that seed alone.
const t = require('tap')
const { backends, played, prng } = require('./helpers')
const { mergeCollisions } = require('../dist/exposition/merge')
const { announce } = require('../dist/core/reclamation')
const { sanitizeLabelValue } = require('../dist/core/labels')
const { G_DELIVERED, G_RETRIES } = require('../dist/core/entities')
const { C_LOG_GENERATION } = require('../dist/core/layout')

const TOPIC_NAMES = ['a.b', 'a_b', 'a b', 'c', 'd.e', 'd_e']
const GROUP_NAMES = ['g.1', 'g_1', 'g 1', 'h', 'k']
const PARTITIONS = 3
const STEPS = 300
/** The main thread, the worker and up to two threads attached late. */
const MAX_THREADS = 4
const BYTES_PER_MESSAGE = 10
/** A late write adds this many bytes per message: not BYTES_PER_MESSAGE, so produced and bytes cannot be mistaken for each other. */
const LATE_BYTES_PER_MESSAGE = 3
/** The ops a failure report shows, up to the failing one… */
const LOG_TAIL = 25
/** …for this many failing seeds of a test (the others in one line each). */
const DETAILED_FAILURES = 5
/** With staleReaders, the chance that a thread reads after a step. */
const STALE_READ_CHANCE = 0.3
const COUNTERS = ['produced', 'bytes', 'delivered', 'dropped', 'dlq']

/** What a step does, by weight out of 100 (a removal about one step in four). */
const OPS = [
  ['append', 25], ['groupCall', 20], ['removeGroup', 10], ['removeTopic', 13], ['lateTopicWrite', 4],
  ['lateGroupWrite', 5], ['announce', 3], ['compact', 6], ['attach', 3], ['nothing', 11],
]

/**
 * `seeds` [from, to]; `staleReaders`: after a step each thread reads with STALE_READ_CHANCE (else
 * every thread reads, and so none is ever still inside a call begun before a removal: no late
 * write); `compactMinInts`: the registry's compaction threshold (undefined: the library's);
 * `announceAfterRemoval`: every thread announces right after each removal, so what is removed
 * retires at the next catch-up (no late write either). `minimums`: what each backend's seeds must
 * exercise together, so that the schedule cannot silently stop reaching the hard paths (about
 * two thirds of what they exercise now).
 */
const SCHEDULES = [
  {
    name: 'stale readers, late writes, the log compacted as often as it may be',
    seeds: [1, 200],
    staleReaders: true,
    compactMinInts: 1,
    announceAfterRemoval: false,
    minimums: { retiringSteps: 20000, compactionsWhileRetiring: 1500, carrySteps: 18000, lateTopicWrites: 400, lateGroupWrites: 250, lateWritesCountingNowhere: 250, checkpointReplays: 9000 },
  },
  {
    name: 'every thread reads after every step',
    seeds: [1001, 1040],
    staleReaders: false,
    compactMinInts: undefined,
    announceAfterRemoval: false,
    minimums: { retiringSteps: 3000, compactionsWhileRetiring: 200, carrySteps: 3500 },
  },
  {
    name: 'stale readers, every thread announces after each removal, the log compacted as often as it may be',
    seeds: [2001, 2040],
    staleReaders: true,
    compactMinInts: 1,
    announceAfterRemoval: true,
    minimums: { carrySteps: 5000, checkpointReplays: 2000 },
  },
]

// --- the model ------------------------------------------------------------------------------------

const emptyCarry = () => ({ produced: 0, bytes: 0, delivered: 0, dropped: 0, dlq: 0, lastSeq: new Map(), retries: new Map() })
const partitionSeries = (label, partition) => `${label} partition ${partition}`
const groupSeries = (label, groupLabel) => `${label} group ${groupLabel}`

/**
 * Every live topic's own numbers, and each label's carry: what its removed names left in its
 * series. Series are numbered: one that leaves (its label, partition or group label no longer on
 * a live name) and comes back is a new instance, which starts from zero.
 */
class Model {
  /** raw topic name → { produced, bytes, partitions: Map<partition, lastSeq>, groups: Map<name, counts>, retired: counts of its removed groups } */
  live = new Map()
  /** label → emptyCarry() */
  carry = new Map()
  #instances = new Map()
  #nextInstance = 0

  /** The instance of a series now (label, partitionSeries() or groupSeries()); undefined: it is not there. */
  instance(series) {
    return this.#instances.get(series)
  }

  liveWithLabel(label) {
    return [...this.live].filter(([name]) => sanitizeLabelValue(name) === label).map(([, topic]) => topic)
  }

  append(name, partition, count) {
    let topic = this.live.get(name)
    if (topic === undefined) this.live.set(name, (topic = { produced: 0, bytes: 0, partitions: new Map(), groups: new Map(), retired: { delivered: 0, dropped: 0, dlq: 0 } }))
    topic.produced += count
    topic.bytes += BYTES_PER_MESSAGE * count
    topic.partitions.set(partition, (topic.partitions.get(partition) ?? 0) + count)
    this.#renumber()
  }

  /** The group's counts (registered now if new): the caller adds to them. */
  group(name, groupName) {
    const topic = this.live.get(name)
    let group = topic.groups.get(groupName)
    if (group === undefined) topic.groups.set(groupName, (group = { delivered: 0, dropped: 0, dlq: 0, retries: 0 }))
    this.#renumber()
    return group
  }

  /** Its delivered, dropped and dlq stay in its topic; its retries in the carry while a live group has its label. */
  removeGroup(name, groupName) {
    const topic = this.live.get(name)
    const group = topic.groups.get(groupName)
    const label = sanitizeLabelValue(name)
    const groupLabel = sanitizeLabelValue(groupName)
    topic.groups.delete(groupName)
    for (const counter of ['delivered', 'dropped', 'dlq']) topic.retired[counter] += group[counter]
    if (groupLabelLive(this.liveWithLabel(label), groupLabel)) add(this.#carryOf(label).retries, groupLabel, group.retries)
    else this.carry.get(label)?.retries.delete(groupLabel)
    this.#renumber()
  }

  /** Its share stays in the carry while a live topic has its label: counters, last_seq where a live topic has the partition, retries where a live group has the group label. */
  removeTopic(name) {
    const topic = this.live.get(name)
    const label = sanitizeLabelValue(name)
    this.live.delete(name)
    const others = this.liveWithLabel(label)
    if (others.length === 0) {
      this.carry.delete(label)
    } else {
      const carry = this.#carryOf(label)
      carry.produced += topic.produced
      carry.bytes += topic.bytes
      for (const counter of ['delivered', 'dropped', 'dlq']) carry[counter] += topic.retired[counter] + sum([...topic.groups.values()].map((g) => g[counter]))
      for (const [partition, lastSeq] of topic.partitions) carry.lastSeq.set(partition, Math.max(carry.lastSeq.get(partition) ?? 0, lastSeq))
      for (const [groupName, group] of topic.groups) add(carry.retries, sanitizeLabelValue(groupName), group.retries)
      // A partition or group label no live topic of the label has leaves, with what was kept for it.
      for (const partition of carry.lastSeq.keys()) if (!others.some((o) => o.partitions.has(partition))) carry.lastSeq.delete(partition)
      for (const groupLabel of carry.retries.keys()) if (!groupLabelLive(others, groupLabel)) carry.retries.delete(groupLabel)
    }
    this.#renumber()
  }

  /** Produced and bytes landing in a removed topic count while the label's series is the one it was removed from (it was kept then). */
  lateTopicWrite(removed, count) {
    if (removed.labelInstance === undefined || this.instance(removed.label) !== removed.labelInstance) return false
    const carry = this.#carryOf(removed.label)
    carry.produced += count
    carry.bytes += LATE_BYTES_PER_MESSAGE * count
    return true
  }

  /** Delivered landing in a removed group counts in its topic while that lives, else in the carry while the label's series is the one it was removed from. */
  lateDelivered(removed, count) {
    if (this.live.get(removed.topicName) === removed.topic) removed.topic.retired.delivered += count
    else if (this.instance(removed.label) === removed.labelInstance) this.#carryOf(removed.label).delivered += count
    else return false
    return true
  }

  /** Retries landing in a removed group count while its group series is the one it was removed from (it was kept then). */
  lateRetries(removed, count) {
    const series = groupSeries(removed.label, removed.groupLabel)
    if (removed.groupInstance === undefined || this.instance(series) !== removed.groupInstance) return false
    add(this.#carryOf(removed.label).retries, removed.groupLabel, count)
    return true
  }

  /** label → the merged series /metrics must show, in canonical() form. */
  expected() {
    const out = new Map()
    for (const [name, topic] of this.live) {
      const label = sanitizeLabelValue(name)
      let series = out.get(label)
      if (series === undefined) out.set(label, (series = { ...emptyCarry(), lastSeq: {}, retries: {} }))
      series.produced += topic.produced
      series.bytes += topic.bytes
      for (const counter of ['delivered', 'dropped', 'dlq']) series[counter] += topic.retired[counter]
      for (const [partition, lastSeq] of topic.partitions) series.lastSeq[partition] = Math.max(series.lastSeq[partition] ?? 0, lastSeq)
      for (const [groupName, group] of topic.groups) {
        for (const counter of ['delivered', 'dropped', 'dlq']) series[counter] += group[counter]
        const groupLabel = sanitizeLabelValue(groupName)
        series.retries[groupLabel] = (series.retries[groupLabel] ?? 0) + group.retries
      }
    }
    for (const [label, series] of out) {
      const carry = this.carry.get(label)
      if (carry === undefined) continue
      for (const counter of COUNTERS) series[counter] += carry[counter]
      for (const [partition, lastSeq] of carry.lastSeq) if (partition in series.lastSeq) series.lastSeq[partition] = Math.max(series.lastSeq[partition], lastSeq)
      for (const [groupLabel, retries] of carry.retries) if (groupLabel in series.retries) series.retries[groupLabel] += retries
    }
    for (const [label, series] of out) out.set(label, canonical(series))
    return out
  }

  #carryOf(label) {
    let carry = this.carry.get(label)
    if (carry === undefined) this.carry.set(label, (carry = emptyCarry()))
    return carry
  }

  /** After every change: a series not there any more loses its instance; one there anew gets the next. */
  #renumber() {
    const now = new Set()
    for (const [name, topic] of this.live) {
      const label = sanitizeLabelValue(name)
      now.add(label)
      for (const partition of topic.partitions.keys()) now.add(partitionSeries(label, partition))
      for (const groupName of topic.groups.keys()) now.add(groupSeries(label, sanitizeLabelValue(groupName)))
    }
    for (const series of this.#instances.keys()) if (!now.has(series)) this.#instances.delete(series)
    for (const series of now) if (!this.#instances.has(series)) this.#instances.set(series, ++this.#nextInstance)
  }
}

const groupLabelLive = (topics, groupLabel) => topics.some((topic) => [...topic.groups.keys()].some((name) => sanitizeLabelValue(name) === groupLabel))
const add = (map, key, amount) => map.set(key, (map.get(key) ?? 0) + amount)
const sum = (values) => values.reduce((a, b) => a + b, 0)

/** A series as plain JSON-able values, keys in order: what the model and the library are compared in. */
function canonical(series) {
  const sorted = (object) => Object.fromEntries(Object.entries(object).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))
  const out = {}
  for (const counter of COUNTERS) out[counter] = series[counter]
  out.lastSeq = sorted(series.lastSeq)
  out.retries = sorted(series.retries)
  return out
}

/** label → the merged series of one reading, as /metrics renders it (exposition/merge.ts), in canonical() form. */
function seriesRead(topics) {
  const out = new Map()
  for (const s of mergeCollisions(topics)) {
    out.set(s.label, canonical({
      produced: s.produced, bytes: s.bytes, delivered: s.delivered, dropped: s.dropped, dlq: s.dlq,
      lastSeq: Object.fromEntries(s.partitionNumbers.map((partition, i) => [partition, s.lastSeq[i]])),
      retries: Object.fromEntries(s.groups.map((group) => [group.label, group.retries])),
    }))
  }
  return out
}

// --- one seeded schedule --------------------------------------------------------------------------

/** The numbers of one series reading whose decrease would be a reset: [key, the instance of its series, value]. */
function monotoneParts(model, label, series) {
  const parts = COUNTERS.map((counter) => [`${label} ${counter}`, model.instance(label), series[counter]])
  for (const [partition, lastSeq] of Object.entries(series.lastSeq)) parts.push([`${label} last_seq ${partition}`, model.instance(partitionSeries(label, partition)), lastSeq])
  for (const [groupLabel, retries] of Object.entries(series.retries)) parts.push([`${label} retries ${groupLabel}`, model.instance(groupSeries(label, groupLabel)), retries])
  return parts
}

const firstLines = (error) => error.stack.split('\n').slice(0, 4).join(' | ')

/** One seed's STEPS steps on one backend; run() returns its first failure. Each op is a method named in OPS. */
class Schedule {
  /** Counts of what the steps exercised (see SCHEDULES' minimums), summed over seeds. */
  static emptyStats() {
    return { ops: 0, readings: 0, retiringSteps: 0, compactionsWhileRetiring: 0, carrySteps: 0, lateTopicWrites: 0, lateGroupWrites: 0, lateWritesCountingNowhere: 0, lateThreads: 0, checkpointReplays: 0 }
  }

  constructor(seed, backend, options, stats) {
    this.seed = seed
    this.backend = backend
    this.options = options
    this.stats = stats
    this.random = prng(seed)
    this.played = played(backend)
    this.model = new Model()
    /** Removals so far. A thread whose last act came before a removal may still be inside a call begun before it. */
    this.epoch = 0
    /** { side, number (in the ops), quietSince (the epoch at its last act), seen (what it last read of each series), generation (the log's, at its last read) } */
    this.threads = []
    this.#attach(this.played.main)
    this.#attach(this.played.worker)
    /** Removed topics and groups a late write may still land in: { entity, epoch, label, instances then, … }. */
    this.removedTopics = []
    this.removedGroups = []
    /** The ops so far, for a failure's report. */
    this.log = []
  }

  /** Runs every step; the first failure (a reading off the model, a decrease, a disagreement, a throw), or undefined. */
  run() {
    let retiring = false
    for (let step = 0; step < STEPS; step++) {
      const thread = this.pick(this.threads)
      let roll = this.random() * 100
      const op = this.model.live.size === 0 ? 'append' : OPS.find(([, weight]) => (roll -= weight) < 0)[0]
      const generation = this.#generation()
      let description
      try {
        description = this[op](thread)
      } catch (error) {
        return this.#failure(step, `${op} (thread ${thread.number})`, { why: `threw: ${firstLines(error)}` })
      }
      if (description === undefined) continue // nothing to act on: no group to remove, no thread that could write late
      this.log.push(description)
      this.stats.ops++
      if (retiring && this.#generation() !== generation) this.stats.compactionsWhileRetiring++
      retiring = this.threads.some((each) => !each.side.registry.retiringTopics().next().done)
      if (retiring) this.stats.retiringSteps++
      if (this.threads.some((each) => each.side.registry.carries.size !== 0)) this.stats.carrySteps++
      const failure = this.#readAndCheck(step, description)
      if (failure !== undefined) return failure
    }
    return undefined
  }

  pick(list) {
    return list[Math.floor(this.random() * list.length)]
  }

  /** A count in 1…max. */
  count(max) {
    return 1 + Math.floor(this.random() * max)
  }

  // ---- the ops: each returns its description for the log, or undefined if it had nothing to act on ----

  append(thread) {
    const name = this.pick(TOPIC_NAMES)
    const partition = Math.floor(this.random() * PARTITIONS)
    const count = this.count(3)
    thread.side.handles.topic(name).append(partition, BYTES_PER_MESSAGE * count, count)
    this.model.append(name, partition, count)
    this.#acted(thread)
    return `thread ${thread.number}: append ${name} partition ${partition} ×${count}`
  }

  groupCall(thread) {
    const name = this.pick([...this.model.live.keys()])
    const groupName = this.pick(GROUP_NAMES)
    const count = this.count(3)
    const group = thread.side.handles.topic(name).group(groupName)
    const modelled = this.model.group(name, groupName)
    this.#acted(thread)
    const call = `thread ${thread.number}: ${name}/${groupName}`
    const kind = this.random()
    if (kind < 0.4) {
      group.redelivered(count)
      modelled.retries += count
      return `${call} redelivered ×${count}`
    }
    if (kind < 0.6) {
      group.dispatched(count) // in_flight is a gauge, the live names' own: not modelled
      return `${call} dispatched ×${count}`
    }
    if (kind < 0.75) {
      group.delivered(count)
      modelled.delivered += count
      return `${call} delivered ×${count}`
    }
    if (kind < 0.9) {
      group.dropped(count)
      modelled.dropped += count
      return `${call} dropped ×${count}`
    }
    if (modelled.dropped > modelled.dlq) { // design §4: dlq ⊆ dropped
      group.deadLettered(1)
      modelled.dlq += 1
      return `${call} deadLettered ×1`
    }
    return `${call} registered`
  }

  removeGroup(thread) {
    const name = this.pick([...this.model.live.keys()])
    const groupNames = [...this.model.live.get(name).groups.keys()]
    if (groupNames.length === 0) return undefined
    const groupName = this.pick(groupNames)
    const topic = thread.side.handles.topic(name)
    thread.side.registry.sync() // as removeGroup() does first: the group is in this thread's picture
    const entity = topic.entity.groups.find((group) => group.name === groupName)
    topic.removeGroup(groupName)
    const modelled = this.model.live.get(name)
    this.model.removeGroup(name, groupName)
    const label = sanitizeLabelValue(name)
    const groupLabel = sanitizeLabelValue(groupName)
    this.#removed(thread, this.removedGroups, {
      entity, topicName: name, topic: modelled, label, groupLabel,
      labelInstance: this.model.instance(label), groupInstance: this.model.instance(groupSeries(label, groupLabel)),
    })
    return `thread ${thread.number}: removeGroup ${name}/${groupName}`
  }

  removeTopic(thread) {
    const name = this.pick([...this.model.live.keys()])
    const registry = thread.side.registry
    registry.sync() // as removeTopic() does first: the topic is in this thread's picture
    const entity = registry.topics.get(name)
    registry.removeTopic(name)
    this.model.removeTopic(name)
    const label = sanitizeLabelValue(name)
    this.#removed(thread, this.removedTopics, { entity, label, labelInstance: this.model.instance(label) })
    return `thread ${thread.number}: removeTopic ${name}`
  }

  /** A thread stopped inside a call since before a topic's removal lands its produced and bytes in the topic's cells. */
  lateTopicWrite() {
    const late = this.#late(this.removedTopics)
    if (late === undefined) return undefined
    const [removed, writer] = late
    const count = this.count(5)
    this.#land(writer, removed.entity.slot, count) // produced
    this.#land(writer, removed.entity.slot + 1, LATE_BYTES_PER_MESSAGE * count) // bytes
    const counts = this.model.lateTopicWrite(removed, count)
    this.stats.lateTopicWrites++
    if (!counts) this.stats.lateWritesCountingNowhere++
    return `thread ${writer.number}: late produced ×${count} into removed topic ${removed.entity.name}#${removed.entity.id} (${counts ? 'counts' : 'counts nowhere'})`
  }

  /** …its delivered or retries in a removed group's. */
  lateGroupWrite() {
    const late = this.#late(this.removedGroups)
    if (late === undefined) return undefined
    const [removed, writer] = late
    const count = this.count(5)
    const delivered = this.random() < 0.5
    this.#land(writer, removed.entity.slot + (delivered ? G_DELIVERED : G_RETRIES), count)
    const counts = delivered ? this.model.lateDelivered(removed, count) : this.model.lateRetries(removed, count)
    this.stats.lateGroupWrites++
    if (!counts) this.stats.lateWritesCountingNowhere++
    return `thread ${writer.number}: late ${delivered ? 'delivered' : 'retries'} ×${count} into removed group ${removed.topicName}/${removed.entity.name}#${removed.entity.id} (${counts ? 'counts' : 'counts nowhere'})`
  }

  announce(thread) {
    announce(thread.side.memory)
    this.#acted(thread)
    return `thread ${thread.number}: announce`
  }

  compact(thread) {
    thread.side.registry.whileSynced(() => thread.side.registry.compact())
    this.#acted(thread)
    return `thread ${thread.number}: compact`
  }

  attach() {
    if (this.threads.length >= MAX_THREADS) return this.nothing()
    const tid = 10 + this.threads.length
    this.played.threads[tid] = { alive: true }
    this.#attach(this.played.side(false, tid))
    this.stats.lateThreads++
    return `thread ${this.threads.length - 1} attaches`
  }

  nothing() {
    return 'nothing (reads only)'
  }

  // ---- what the ops share ----

  #attach(side) {
    if (this.options.compactMinInts !== undefined) side.registry.compactMinInts = this.options.compactMinInts
    this.threads.push({ side, number: this.threads.length, quietSince: this.epoch, seen: new Map(), generation: -1 })
  }

  /** The thread ran (it is inside no call begun before now). */
  #acted(thread) {
    thread.quietSince = this.epoch
  }

  /** A removal by `thread`, which announced it at once (reclamation.ts advanceEpoch); with announceAfterRemoval, every thread announces. */
  #removed(thread, removals, removed) {
    this.epoch++
    removals.push({ ...removed, epoch: this.epoch })
    for (const each of this.options.announceAfterRemoval ? this.threads : [thread]) {
      if (each !== thread) announce(each.side.memory)
      this.#acted(each)
    }
  }

  /** A removal some thread may still be inside a call begun before (it has not acted since), and that thread; undefined if none. */
  #late(removals) {
    const open = removals.filter((removal) => this.threads.some((thread) => thread.quietSince < removal.epoch))
    removals.splice(0, removals.length, ...open) // quietSince only grows: the others are closed for good
    if (open.length === 0) return undefined
    const removal = this.pick(open)
    return [removal, this.pick(this.threads.filter((thread) => thread.quietSince < removal.epoch))]
  }

  /** Adds `amount` to one of the writer's row cells, as its call under way since before the removal does. */
  #land(writer, slot, amount) {
    const [cells, index] = writer.side.recorder.cells(slot)
    cells[index] += amount
  }

  #generation() {
    return Atomics.load(this.played.main.memory.control, C_LOG_GENERATION)
  }

  /**
   * Some threads read (every one unless staleReaders) and each reading is checked: first what
   * needs no model (no series instance goes down on the thread; the threads reading at this step
   * agree), then against the model.
   */
  #readAndCheck(step, op) {
    const readers = this.options.staleReaders ? this.threads.filter(() => this.random() < STALE_READ_CHANCE) : this.threads
    const expected = this.model.expected()
    const agreed = new Map() // label → [thread, what it read] of the first thread that read it at this step
    const generation = this.#generation()
    for (const reader of readers) {
      let read
      try {
        read = seriesRead(this.played.read(reader.side))
      } catch (error) {
        return this.#failure(step, op, { thread: reader.number, why: `read threw: ${firstLines(error)}` })
      }
      this.#acted(reader)
      this.stats.readings++
      if (reader.generation !== -1 && reader.generation !== generation) this.stats.checkpointReplays++
      reader.generation = generation
      for (const label of new Set([...read.keys(), ...expected.keys()])) {
        const got = read.get(label)
        const want = expected.get(label)
        const fail = (why, extra) => this.#failure(step, op, { thread: reader.number, label, why, got, want, ...extra })
        for (const [key, instance, value] of got === undefined ? [] : monotoneParts(this.model, label, got)) {
          const before = reader.seen.get(key)
          // (a series the model has not: no instance, the comparison with the model below says so)
          if (instance !== undefined && before?.[0] === instance && value < before[1]) return fail(`${key} went down on this thread: ${before[1]} → ${value}`)
          reader.seen.set(key, [instance, value])
        }
        const other = agreed.get(label)
        if (other !== undefined && JSON.stringify(other[1]) !== JSON.stringify(got)) return fail(`thread ${other[0]} read another series at this step`, { other: other[1] })
        agreed.set(label, [reader.number, got])
        if (JSON.stringify(got) !== JSON.stringify(want)) return fail(got === undefined ? 'the series is missing' : want === undefined ? 'a series the model has not' : 'not the model\'s series')
      }
    }
    return undefined
  }

  #failure(step, op, details) {
    return { seed: this.seed, backend: this.backend, step, op, ...details, ops: this.log.slice(-LOG_TAIL) }
  }
}

// --- the tests --------------------------------------------------------------------------------------

/** `CARRY_MODEL_SEED=<n>` runs seed n alone (in each schedule), to replay a failure. */
const replaySeed = process.env.CARRY_MODEL_SEED === undefined ? undefined : Number(process.env.CARRY_MODEL_SEED)

function seedsOf(schedule) {
  if (replaySeed !== undefined) return [replaySeed]
  const seeds = []
  for (let seed = schedule.seeds[0]; seed <= schedule.seeds[1]; seed++) seeds.push(seed)
  return seeds
}

for (const backend of backends()) {
  for (const schedule of SCHEDULES) {
    t.test(`${backend}: ${schedule.name}: every series read is the model's, never goes down, and threads agree`, (t) => {
      const seeds = seedsOf(schedule)
      const stats = Schedule.emptyStats()
      let failing = 0
      for (const seed of seeds) {
        const failure = new Schedule(seed, backend, schedule, stats).run()
        if (failure === undefined) continue
        failing++
        const { step, op, thread, label, why, ...details } = failure
        const replay = `CARRY_MODEL_SEED=${seed} npx tap test/carry-model.test.js`
        // Past the first few failing seeds, one line each: the seed replays the rest.
        t.fail(`seed ${seed} (${backend}), step ${step}, after "${op}": thread ${thread ?? '-'} reads ${label ?? '-'}: ${why}`, failing <= DETAILED_FAILURES ? { ...details, replay } : { replay })
      }
      if (failing === 0) t.pass(`${seeds.length} seed${seeds.length === 1 ? '' : 's'} × ${STEPS} steps: every reading is the model's`)
      t.comment(`${backend}, ${schedule.name}: ${JSON.stringify(stats)}`)
      if (replaySeed === undefined) {
        for (const [what, minimum] of Object.entries(schedule.minimums)) t.ok(stats[what] >= minimum, `the seeds exercise ${what}: ${stats[what]} ≥ ${minimum}`)
      }
      t.end()
    })
  }
}
