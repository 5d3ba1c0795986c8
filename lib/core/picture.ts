// This thread's picture of the registry: its live topics by name, id and label, with their
// partitions, groups, floors and windows (entities.ts); the topics and groups still retiring; each
// label's carry (carry.ts); the folds; and the free queues (blocks.ts). It changes only as the
// registration log's entries are replayed into it (apply), in log order, so that every thread that
// replays the same entries holds the same picture. The registry (registry.ts) reads and writes the
// log, hands each entry here, and reads the picture to decide what to write. Replaying a removal
// clears its liveness tags in the shared row, whichever thread replays it first: that is what
// makes the removal (docs/reclamation.md, "Removal"). Caller locks throughout.
import { LabelCarry } from './carry'
import { GroupEntity, TopicEntity, inserted, sameNumbers } from './entities'
import { Blocks, KEY_FLOOR, KEY_GROUP, KEY_HEADER, KEY_PARTITION, KEY_TOPIC, blockSize, windowKey } from './blocks'
import { sanitizeLabelValue } from './labels'
import { LogCapacity, heldInts } from './log-capacity'
import { CarryKind, Entry, EntryAt, entryLength, narrow, readText, wideAmount } from './log'
import { SLOTS_PER_CHUNK } from './layout'
import { Count, addCount } from './snapshot'

export class Picture {
  readonly topics = new Map<string, TopicEntity>() // live topics by raw name
  readonly #topicsById = new Map<number, TopicEntity>()
  readonly #groupsById = new Map<number, GroupEntity>() // live and retiring (a retiring topic's too)
  /** Live topics by label: the label's series lives while one does (design §3.5). */
  readonly #byLabel = new Map<string, TopicEntity[]>()
  /**
   * Topics removed while another live topic had their label, in removal (epoch) order: their
   * counts still add to the label's series until they retire into its carry (TopicEntity.retireEpoch).
   */
  readonly #retiringTopics = new Map<number, TopicEntity>()
  /** The same topics by label. */
  readonly #retiringByLabel = new Map<string, TopicEntity[]>()
  /** Whether the entry being applied is part of a checkpoint (it restates state; it decides nothing). */
  #inCheckpoint = false
  /** Label → what its removed topics and groups left in its series (LabelCarry), while a live topic has the label. */
  readonly carries = new Map<string, LabelCarry>()
  /** Retiring groups, every topic's (see TopicEntity.retiring). */
  #retiring: GroupEntity[] = []
  /** slot → amount moved out of a row when it neared 2^53 (design §4: 64-bit counters). */
  readonly folds = new Map<number, bigint>()
  /** While a checkpoint is replayed over an existing picture: the ids it names (the rest are gone). */
  #seen: Set<number> | undefined
  /**
   * The highest epoch a replayed removal named: a removal whose thread stopped after publishing it
   * (a worker terminated) has not advanced the epoch yet, and the registry's catch-up does it on
   * its behalf (then sets this back to 0).
   */
  owedEpoch = 0
  /** Bumped by every applied entry that changes the set of series. */
  generation = 0
  /** Told when this picture lets a removed topic or group go (Registry.onTopicRemoved). */
  onTopicRemoved: ((topic: TopicEntity) => void) | undefined
  onGroupRemoved: ((group: GroupEntity) => void) | undefined
  /** The free queues: replayed registrations take blocks from them, removals and retirements release blocks into them. */
  readonly #blocks: Blocks
  /** Told how many log cells each replayed removal or retirement frees (what a compaction would drop). */
  readonly #capacity: LogCapacity
  /** The shared row's chunk holding a slot (where liveness tags are). */
  readonly #sharedCells: (slot: number) => Float64Array

  constructor(blocks: Blocks, capacity: LogCapacity, sharedCells: (slot: number) => Float64Array) {
    this.#blocks = blocks
    this.#capacity = capacity
    this.#sharedCells = sharedCells
  }

  /** Live topics by id. */
  get topicsById(): ReadonlyMap<number, TopicEntity> {
    return this.#topicsById
  }

  /** Live and retiring groups by id (a retiring topic's too). */
  get groupsById(): ReadonlyMap<number, GroupEntity> {
    return this.#groupsById
  }

  /** The topics retiring into their label's carry, in removal (epoch) order. */
  get retiringTopics(): ReadonlyMap<number, TopicEntity> {
    return this.#retiringTopics
  }

  /** The retiring groups, every topic's, in removal (epoch) order. */
  get retiring(): readonly GroupEntity[] {
    return this.#retiring
  }

  /** The topics with `label` retiring into its carry (none: an empty array). */
  retiringWithLabel(label: string): readonly TopicEntity[] {
    return this.#retiringByLabel.get(label) ?? NO_TOPICS
  }

  /** The live topics with `label` (none: an empty array). */
  liveWithLabel(label: string): readonly TopicEntity[] {
    return this.#byLabel.get(label) ?? NO_TOPICS
  }

  /** Whether a live group (but `except`) of a live topic with label `label` has the group label `groupLabel`. */
  groupLabelLive(label: string, groupLabel: string, except?: GroupEntity): boolean {
    for (const topic of this.liveWithLabel(label)) if (topic.hasGroupLabel(groupLabel, except)) return true
    return false
  }

  /** A checkpoint is about to be replayed over this picture: reset what it restates in full. */
  beginCheckpoint(): void {
    this.#seen = new Set()
    this.folds.clear()
    this.#blocks.clear()
    this.carries.clear()
    for (const topic of this.#retiringTopics.values()) topic.carriedPartitions = new Set()
    for (const topic of [...this.#topicsById.values(), ...this.#retiringTopics.values()]) {
      topic.retiredDelivered = topic.retiredDropped = topic.retiredDlq = 0
      for (const group of topic.retiring) group.retireEpoch = 0
      topic.retiring = []
    }
    this.#retiring = []
  }

  /** The checkpoint is replayed: whatever it did not name is gone. */
  #endCheckpoint(seen: Set<number>): void {
    // A retiring topic the checkpoint does not name has retired: its blocks are in the free queues it restated.
    for (const [id, topic] of [...this.#retiringTopics]) if (!seen.has(id)) this.#retiredTopic(topic)
    for (const topic of [...this.#topicsById.values()]) {
      if (!seen.has(topic.id)) {
        this.#forgetTopic(topic)
        continue
      }
      for (const group of topic.groups) if (!seen.has(group.id)) this.#forgetGroup(group)
    }
    for (const [id, group] of this.#groupsById) if (!seen.has(id)) this.#forgetGroup(group)
    this.generation++
  }

  #forgetTopic(topic: TopicEntity): void {
    this.#leaveLive(topic)
    for (const group of [...topic.groups, ...topic.retiring]) this.#groupsById.delete(group.id)
    // The label's series leaves with its last live topic: what retired into it, or still retires, goes too.
    if (this.liveWithLabel(topic.label).length === 0) {
      const carry = this.carries.get(topic.label)
      if (!this.#inCheckpoint && carry !== undefined) for (const [, fields, text] of carry.entries(0)) this.#capacity.freed(entryLength(fields.length, text))
      this.carries.delete(topic.label)
      for (const retiring of [...this.retiringWithLabel(topic.label)]) {
        if (!this.#inCheckpoint) this.#capacity.freed(heldInts(retiring))
        this.#releaseTopic(retiring, retiring.retireEpoch)
        this.#retiredTopic(retiring)
      }
    }
    this.onTopicRemoved?.(topic)
  }

  /** The topic is no longer live (removed, retiring or not): out of the names, ids and labels; its groups too. */
  #leaveLive(topic: TopicEntity): void {
    topic.alive = false
    // A checkpoint replayed over an old picture may name a new topic of the same name first.
    if (this.topics.get(topic.name) === topic) this.topics.delete(topic.name)
    this.#topicsById.delete(topic.id)
    without(this.#byLabel, topic)
    for (const group of [...topic.groups, ...topic.retiring]) group.alive = false
    this.#retiring = this.#retiring.filter((group) => group.topic !== topic)
  }

  /**
   * A topic removed while another live topic has its label (RemoveTopic with keep): it retires
   * into the label's carry once its epoch has passed (Registry #retirePassed); until then the reader adds
   * its cells to the label's series. Its groups stay known by id (entries name them) until then.
   */
  #keepTopic(topic: TopicEntity, epoch: number): void {
    this.#leaveLive(topic)
    topic.retireEpoch = epoch
    if (epoch > this.owedEpoch) this.owedEpoch = epoch
    this.#retiringTopics.set(topic.id, topic)
    withTopic(this.#retiringByLabel, topic)
    // Which of its shares stay is decided now, from what the label's live names show (a
    // checkpoint restates it: its RemoveGroup and Carries entries). A partition or group label
    // only this topic had leaves with it: so does what removed names left there.
    topic.carriedPartitions = new Set()
    if (!this.#inCheckpoint) {
      const live = this.liveWithLabel(topic.label)
      for (const partition of topic.partitionNumbers) {
        if (live.some((t) => t.partitionSlot(partition) !== undefined)) topic.carriedPartitions.add(partition)
        else this.#partitionGone(topic.label, partition)
      }
      for (const group of topic.groups) {
        group.carries = this.groupLabelLive(topic.label, group.label)
        if (!group.carries) this.#groupLabelGone(topic.label, group.label)
      }
    }
    this.onTopicRemoved?.(topic)
  }

  /** No live topic of `label` has `partition` any more: its series is gone, and what removed topics left in it. */
  #partitionGone(label: string, partition: number): void {
    this.carries.get(label)?.lastSeq.delete(partition)
    for (const retiring of this.retiringWithLabel(label)) retiring.carriedPartitions!.delete(partition)
  }

  /** No live group of `label`'s topics has `groupLabel` any more: its series is gone, and what removed groups left in it. */
  #groupLabelGone(label: string, groupLabel: string): void {
    this.carries.get(label)?.retries.delete(groupLabel)
    for (const topic of this.liveWithLabel(label)) for (const group of topic.retiring) if (group.label === groupLabel) group.carries = false
    for (const topic of this.retiringWithLabel(label)) {
      for (const group of topic.groups) if (group.label === groupLabel) group.carries = false
      for (const group of topic.retiring) if (group.label === groupLabel) group.carries = false
    }
  }

  /** A topic's blocks (its cells, its partitions', its groups') freed at `epoch`. */
  #releaseTopic(topic: TopicEntity, epoch: number): void {
    for (const slot of topic.partitionSlots) this.#release(KEY_PARTITION, slot, epoch)
    for (const group of [...topic.groups, ...topic.retiring]) this.#releaseGroup(group, epoch)
    this.#release(KEY_TOPIC, topic.slot, epoch)
  }

  /** A retiring topic is done with (retired into its carry, or its label's series gone): forgotten. */
  #retiredTopic(topic: TopicEntity): void {
    this.#retiringTopics.delete(topic.id)
    without(this.#retiringByLabel, topic)
    for (const group of [...topic.groups, ...topic.retiring]) this.#groupsById.delete(group.id)
    this.generation++
  }

  #forgetGroup(group: GroupEntity): void {
    const wasLive = group.alive
    group.alive = false
    const topic = group.topic
    topic.dropGroup(group)
    topic.retiring = topic.retiring.filter((g) => g !== group)
    this.#retiring = this.#retiring.filter((g) => g !== group)
    this.#groupsById.delete(group.id)
    if (wasLive) this.onGroupRemoved?.(group)
  }

  /**
   * Replays the entry at `position` (`entry`: as the log read it). `inCheckpoint`: the entry is
   * part of its generation's checkpoint. `texts`: the names of the entries this thread is
   * appending, by position (applied from the strings it has, not re-read: one copy).
   */
  apply(position: number, entry: EntryAt, inCheckpoint: boolean, texts?: Map<number, string>): void {
    const { log, fields: f, type, next } = entry
    this.#inCheckpoint = inCheckpoint
    switch (type) {
      case Entry.Skip:
        return
      case Entry.Topic: {
        const id = narrow(log[f], log[f + 1])
        this.#seen?.add(id)
        const known = this.#topicsById.get(id)
        if (known !== undefined) {
          // A checkpoint restating a topic this thread knows (the name is its own again, should a
          // retiring topic of the same name, restated before it, have taken it).
          this.topics.set(known.name, known)
          return
        }
        if (this.#retiringTopics.has(id)) return
        const name = this.#textAt(texts, position, log, f + 3)
        this.#take(KEY_TOPIC, log[f + 2])
        const topic = new TopicEntity(id, name, sanitizeLabelValue(name), log[f + 2])
        this.topics.set(name, topic)
        this.#topicsById.set(topic.id, topic)
        withTopic(this.#byLabel, topic)
        break
      }
      case Entry.RemoveTopic: {
        const id = narrow(log[f], log[f + 1])
        const epoch = narrow(log[f + 2], log[f + 3])
        const kept = this.#retiringTopics.get(id)
        if (kept !== undefined) {
          // A checkpoint restating a topic this thread knows retiring: its retiring groups, just
          // restated, retire with it, not on their own.
          this.#retiring = this.#retiring.filter((group) => group.topic !== kept)
          return
        }
        const topic = this.#topicsById.get(id)!
        // Its tags cleared (by whichever thread replays it first: the remover, or, if that thread
        // stopped just after publishing it, the next one): every handle of it throws from now on.
        this.#clearTag(topic.slot, topic.id)
        for (const group of topic.groups) this.#clearTag(group.slot, group.id)
        if (log[f + 4] === 1) {
          // Another live topic has its label: its counts stay in the label's series (design §3.5).
          this.#keepTopic(topic, epoch)
        } else {
          // Every thread replays the same entries into the same queues, so it queues the same
          // blocks in the same order. They wait for the removal's epoch (reclamation.ts).
          if (!this.#inCheckpoint) this.#capacity.freed(heldInts(topic))
          this.#releaseTopic(topic, epoch)
          this.#forgetTopic(topic)
        }
        break
      }
      case Entry.Carries: {
        const topic = this.#retiringTopics.get(narrow(log[f], log[f + 1]))!
        for (let at = f + 2; at < f + (next - position - 1); at++) topic.carriedPartitions!.add(log[at])
        return
      }
      case Entry.TopicRetired: {
        const topic = this.#retiringTopics.get(narrow(log[f], log[f + 1]))!
        if (!this.#inCheckpoint) this.#capacity.freed(heldInts(topic))
        this.#releaseTopic(topic, topic.retireEpoch)
        this.#retiredTopic(topic)
        return
      }
      case Entry.Carry: {
        const label = this.#topicOf(log, f).label
        let carry = this.carries.get(label)
        if (carry === undefined) this.carries.set(label, (carry = new LabelCarry()))
        const kind = log[f + 2] as CarryKind
        carry.add(kind, log[f + 3], exact(wideAmount(log[f + 4], log[f + 5])), kind === CarryKind.Retries ? this.#textAt(texts, position, log, f + 6) : '')
        break
      }
      case Entry.Partition: {
        const topic = this.#topicOf(log, f)
        if (topic.partitionSlot(log[f + 2]) !== undefined) return
        this.#take(KEY_PARTITION, log[f + 3])
        ;[topic.partitionNumbers, topic.partitionSlots] = inserted(topic.partitionNumbers, topic.partitionSlots, log[f + 2], log[f + 3])
        break
      }
      case Entry.Group: {
        const id = narrow(log[f + 2], log[f + 3])
        this.#seen?.add(id)
        if (this.#groupsById.has(id)) return
        const topic = this.#topicOf(log, f)
        const name = this.#textAt(texts, position, log, f + 7)
        this.#take(KEY_GROUP, log[f + 4])
        const group = new GroupEntity(topic, id, name, sanitizeLabelValue(name), log[f + 4], log[f + 5], log[f + 6])
        topic.addGroup(group)
        this.#groupsById.set(group.id, group)
        break
      }
      case Entry.RemoveGroup: {
        const group = this.#groupsById.get(narrow(log[f], log[f + 1]))!
        const wasLive = group.alive
        group.alive = false
        group.retireEpoch = narrow(log[f + 2], log[f + 3])
        group.carries = log[f + 4] === 1
        this.#clearTag(group.slot, group.id) // as RemoveTopic
        if (group.retireEpoch > this.owedEpoch) this.owedEpoch = group.retireEpoch
        const topic = group.topic
        topic.dropGroup(group)
        topic.retiring = [...topic.retiring, group]
        this.#retiring.push(group)
        // No live group has its label any more: the label's series of it is gone, and so is what it carried.
        if (!this.#inCheckpoint && wasLive && !group.carries) this.#groupLabelGone(topic.label, group.label)
        if (wasLive) this.onGroupRemoved?.(group)
        break
      }
      case Entry.Retired: {
        const topic = this.#topicOf(log, f)
        topic.retiredDelivered = addCount(topic.retiredDelivered, exact(wideAmount(log[f + 4], log[f + 5])))
        topic.retiredDropped = addCount(topic.retiredDropped, exact(wideAmount(log[f + 6], log[f + 7])))
        topic.retiredDlq = addCount(topic.retiredDlq, exact(wideAmount(log[f + 8], log[f + 9])))
        const groupId = narrow(log[f + 2], log[f + 3])
        const group = groupId === 0 ? undefined : this.#groupsById.get(groupId)
        if (group !== undefined) {
          if (!this.#inCheckpoint) this.#capacity.freed(heldInts(group))
          this.#releaseGroup(group, group.retireEpoch)
          this.#forgetGroup(group)
        }
        break
      }
      case Entry.Floor: {
        const group = this.#groupsById.get(narrow(log[f], log[f + 1]))!
        if (group.floorSlot(log[f + 2]) !== undefined) return
        this.#take(KEY_FLOOR, log[f + 3])
        const [partitions, slots] = inserted(group.floorPartitions, group.floorSlots, log[f + 2], log[f + 3])
        const all = group.topic.partitionNumbers
        group.floorPartitions = sameNumbers(partitions, all) ? all : partitions
        group.floorSlots = slots
        break
      }
      case Entry.Window: {
        const group = this.#groupsById.get(narrow(log[f], log[f + 1]))!
        if (group.windowSlot(log[f + 2]) !== undefined) return
        this.#take(windowKey(group.window), log[f + 3])
        this.#take(KEY_HEADER, log[f + 4])
        group.windowHeaders = inserted(group.windowPartitions, group.windowHeaders, log[f + 2], log[f + 4])[1]
        ;[group.windowPartitions, group.windowSlots] = inserted(group.windowPartitions, group.windowSlots, log[f + 2], log[f + 3])
        break
      }
      case Entry.Fold: {
        const slot = log[f]
        this.folds.set(slot, (this.folds.get(slot) ?? 0n) + wideAmount(log[f + 1], log[f + 2]))
        return
      }
      case Entry.Free: {
        // [key, then slot and epoch (two cells) per block]; the entry's length (header included) says how many.
        const blocks = (next - position - 2) / 3
        for (let b = 0, at = f + 1; b < blocks; b++, at += 3) this.#release(log[f], log[at], narrow(log[at + 1], log[at + 2]))
        return
      }
      case Entry.CheckpointEnd:
        if (this.#seen !== undefined) this.#endCheckpoint(this.#seen)
        this.#seen = undefined
        this.#retiring.sort((a, b) => a.retireEpoch - b.retireEpoch) // a checkpoint lists them by topic
        return
    }
    this.generation++
  }

  /** The topic (live, or retiring into its label's carry) whose id an entry's first two fields hold. */
  #topicOf(log: Int32Array, f: number): TopicEntity {
    const id = narrow(log[f], log[f + 1])
    return this.#topicsById.get(id) ?? this.#retiringTopics.get(id)!
  }

  #textAt(texts: Map<number, string> | undefined, position: number, log: Int32Array, at: number): string {
    return texts?.get(position) ?? readText(log, at)
  }

  /** A block is in use again: drop it from the free queue and forget its old folds. */
  #take(key: number, slot: number): void {
    this.#blocks.take(key, slot)
    for (let i = 0; i < blockSize(key); i++) this.folds.delete(slot + i)
  }

  /** A group's blocks (its cells and its floors), freed at `epoch`. */
  #releaseGroup(group: GroupEntity, epoch: number): void {
    for (const slot of group.floorSlots) this.#release(KEY_FLOOR, slot, epoch)
    for (const slot of group.windowSlots) this.#release(windowKey(group.window), slot, epoch)
    for (const slot of group.windowHeaders) this.#release(KEY_HEADER, slot, epoch)
    this.#release(KEY_GROUP, group.slot, epoch)
  }

  #release(key: number, slot: number, epoch: number): void {
    this.#blocks.release(key, slot, epoch)
    if (epoch > this.owedEpoch) this.owedEpoch = epoch
  }

  /**
   * Clears the liveness tag at `slot` unless it names another entity (a thread replaying an old
   * removal must not clear the tag of what reuses the block since). A tag found 0 is written 0
   * again: the clear is then this thread's own, ordered before the epoch it may advance for a
   * remover that stopped (reclamation.ts catchUpEpoch). Caller locks: tags change only under it.
   */
  #clearTag(slot: number, id: number): void {
    const cells = this.#sharedCells(slot)
    const at = slot % SLOTS_PER_CHUNK
    if (cells[at] === id || cells[at] === 0) cells[at] = 0
  }
}

const NO_TOPICS: readonly TopicEntity[] = []

/** `topic` added to its label's list in `byLabel`. */
function withTopic(byLabel: Map<string, TopicEntity[]>, topic: TopicEntity): void {
  const sharing = byLabel.get(topic.label)
  if (sharing === undefined) byLabel.set(topic.label, [topic])
  else sharing.push(topic)
}

/** `topic` taken out of its label's list in `byLabel` (the list goes with its last topic). */
function without(byLabel: Map<string, TopicEntity[]>, topic: TopicEntity): void {
  const sharing = byLabel.get(topic.label)
  const at = sharing === undefined ? -1 : sharing.indexOf(topic)
  if (at < 0) return
  if (sharing!.length === 1) byLabel.delete(topic.label)
  else sharing!.splice(at, 1)
}

/** A bigint amount as a Count: a number while it is safe. */
function exact(amount: bigint): Count {
  return amount <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(amount) : amount
}
