// Names → slots, shared by every thread of the process: the registration calls (topics,
// partitions, groups, their ack floors and settlement windows), removals, the retirements and
// folds they lead to, and the registration log they are all written to.
//
// Registration is rare and goes through the registration log in shared memory (log.ts), written
// under the lock: every thread replays the same entries in the same order, so each holds an
// identical local picture (picture.ts: names, slot bases, free queues) without any message
// passing — a topic first seen in a worker is in the main thread's next snapshot because the
// snapshot replays the log first. Here a call catches up with the log, decides from the picture
// what to write, takes its blocks (blocks.ts), writes its entries and publishes them with one
// store, then replays them like any other thread. Whether the log takes them, and when it is
// compacted into a checkpoint of what is alive (checkpoint.ts), is log-capacity.ts's to say, so
// that neither the log nor any thread's picture grows with history. Removed topics' and groups'
// blocks are reused only once no recording call can still write into them (reclamation.ts).
// Recording never touches the log.
import { ResolvedConfig } from './config'
import {
  DEFAULT_SETTLE_WINDOW, G_DELIVERED, G_DLQ, G_DROPPED, G_RETRIES, G_START, G_START_HIGH, G_TAG, G_WINDOWED, GONE_CHECK_MS, GroupEntity, P_BASE, T_GROUP_LEFT, T_PARTITIONS, TopicEntity,
} from './entities'
import { LogCapacity, topicRetirementInts } from './log-capacity'
import { Blocks, KEY_FLOOR, KEY_GROUP, KEY_HEADER, KEY_PARTITION, KEY_TOPIC, windowKey } from './blocks'
import { Picture } from './picture'
import { leftClock } from './left'
import { checkpoint } from './checkpoint'
import { ClosedError, LimitError, RemovedGroupError, RemovedTopicError } from './errors'
import { LabelCarry, carryEntries } from './carry'
import { CarryKind, Entry, RegistrationLog, amountRows, endAfter, entryLength, wide } from './log'
import { B_NEXT_ID, C_CLOSED, C_LOG_CHECKPOINT, C_LOG_END, C_LOG_GENERATION, C_NEXT_CHUNK, C_RECOUNT, C_SLOTS_RESERVED, SHARED_ROW, SLOTS_PER_CHUNK } from './layout'
import { Memory } from './memory'
import { advanceEpoch, catchUpEpoch, nextEpoch, passedEpoch, ring } from './reclamation'
import { Count, addCount } from './snapshot'

/** A group's start (GroupOptions.from) as the registry takes it: a committed start is a Map of partition → floor. */
export type Start = 'earliest' | 'latest' | ReadonlyMap<number, number>

/** What Registry.arenaUsage() reports (surface.arenaUsage(): docs/api.md). */
export interface ArenaUsage {
  slotsInUse: number
  slotsReserved: number
  freeBlocks: number
  chunks: number
  logBytes: number
  threadRows: number
}

export class Registry {
  readonly memory: Memory
  readonly config: ResolvedConfig
  /** This thread's picture: what the log's entries, replayed, say is registered (picture.ts). */
  readonly #picture: Picture
  /** The picture's live topics by raw name. */
  readonly topics: Map<string, TopicEntity>
  /** The picture's carries: label → what its removed topics and groups left in its series (LabelCarry). */
  readonly carries: Map<string, LabelCarry>
  /** The picture's folds: slot → amount moved out of a row when it neared 2^53 (design §4: 64-bit counters). */
  readonly folds: Map<number, bigint>
  /** Where blocks come from, and the freed ones waiting for reuse. */
  readonly #blocks: Blocks
  readonly #sharedChunks: Float64Array[] = [] // the shared row's chunks by number (#sharedF64)
  readonly #log: RegistrationLog
  /** The log generation this thread's picture follows (−1: none yet), and how far it replayed it. */
  #logGeneration = -1
  #cursor = 0
  /** The highest epoch known passed by every other thread (reclamation.ts), and when /proc was last asked. */
  #passed = 0
  #goneCheckedAt = 0
  /** When the log refuses a call for want of room, and when it is compacted. */
  readonly #capacity: LogCapacity

  constructor(memory: Memory, config: ResolvedConfig) {
    this.memory = memory
    this.config = config
    this.#log = new RegistrationLog(memory)
    this.#blocks = new Blocks(memory, (epoch) => this.#hasPassed(epoch))
    this.#capacity = new LogCapacity(memory.control, {
      reclaim: () => this.reclaim(),
      compact: () => this.compact(),
      retirementsPending: () => this.#retirementsPending(),
    })
    this.#picture = new Picture(this.#blocks, this.#capacity, (slot) => this.#sharedF64(slot))
    this.topics = this.#picture.topics
    this.carries = this.#picture.carries
    this.folds = this.#picture.folds
  }

  /** Bumped by every replayed entry that changes the set of series (the reader's cue to sort again). */
  get generation(): number {
    return this.#picture.generation
  }

  /**
   * Told when this thread replays a removal (whichever thread removed it), so that the thread's
   * handles (handles.ts) let the removed one go: a worker that met many topics the main thread later removed would
   * otherwise keep one dead handle each.
   */
  get onTopicRemoved(): ((topic: TopicEntity) => void) | undefined {
    return this.#picture.onTopicRemoved
  }

  set onTopicRemoved(told: ((topic: TopicEntity) => void) | undefined) {
    this.#picture.onTopicRemoved = told
  }

  get onGroupRemoved(): ((group: GroupEntity) => void) | undefined {
    return this.#picture.onGroupRemoved
  }

  set onGroupRemoved(told: ((group: GroupEntity) => void) | undefined) {
    this.#picture.onGroupRemoved = told
  }

  /** How many Int32 cells one generation of the log may hold (log-capacity.ts); tests lower it to fill the log. */
  get logCapacityInts(): number {
    return this.#capacity.logCapacityInts
  }

  set logCapacityInts(ints: number) {
    this.#capacity.logCapacityInts = ints
  }

  /** How many slot chunks registrations may open (blocks.ts MAX_SLOT_CHUNKS); tests lower it to fill the counter memory. */
  get slotChunkLimit(): number {
    return this.#blocks.maxChunks
  }

  set slotChunkLimit(chunks: number) {
    this.#blocks.maxChunks = chunks
  }

  /** The log length (Int32 units) below which it is never compacted (log-capacity.ts); tests lower it to compact often. */
  get compactMinInts(): number {
    return this.#capacity.compactMinInts
  }

  set compactMinInts(ints: number) {
    this.#capacity.compactMinInts = ints
  }

  /** Replays what other threads appended since the last call (a read of two cells when nothing did). */
  sync(): void {
    this.#sync(true)
  }

  /**
   * sync() in parts, for the scrape thread's read in slices (observer.ts): under the lock the
   * caller holds, replays the log until `deadline` (performance.now()) has passed, 63 entries at
   * least; true once caught up. A thread started on a large surface has the whole log to replay
   * (20,000 topics: some 70 ms), which in one hold would keep every registration waiting as long.
   * Between two parts this thread's picture is the log's up to where it stopped, as a thread that
   * synced then would know it (a checkpoint half replayed included: its end, or a new generation's
   * checkpoint, completes it). The caller reads nothing, and runs nothing else that uses the
   * picture, until this returns true.
   */
  syncUntil(deadline: number): boolean {
    if (this.#caughtUp()) return true
    this.memory.lock()
    try {
      return this.#catchUp(deadline)
    } finally {
      this.memory.unlock()
    }
  }

  /**
   * sync() if the registration lock is free now; false if it was not (nothing done). For a caller
   * that holds a group's lock and can do without (only a fold or a credit read waits under one).
   */
  trySync(): boolean {
    return this.#sync(false)
  }

  /** Nothing to replay and no recount owed: a read of three cells. */
  #caughtUp(): boolean {
    const control = this.memory.control
    return Atomics.load(control, C_LOG_GENERATION) === this.#logGeneration && Atomics.load(control, C_LOG_END) === this.#cursor && control[C_RECOUNT] === 0
  }

  #sync(wait: boolean): boolean {
    if (this.#caughtUp()) return true
    if (wait) this.memory.lock()
    else if (!this.memory.tryLock()) return false
    try {
      this.#catchUp()
    } finally {
      this.memory.unlock()
    }
    return true
  }

  /**
   * Caller holds the lock: the log is read only under it (a compaction rewrites its chunks).
   * With a `deadline`, stops there (syncUntil()); true when caught up.
   */
  #catchUp(deadline?: number): boolean {
    const control = this.memory.control
    const generation = control[C_LOG_GENERATION]
    if (generation !== this.#logGeneration) {
      // A new generation starts with a checkpoint of everything alive: replayed over what this
      // thread knows, it keeps the entities (handles hold them) and drops what it no longer names.
      if (this.#logGeneration >= 0) {
        this.#capacity.restart()
        this.#picture.beginCheckpoint()
      }
      this.#logGeneration = generation
      this.#cursor = 0
    }
    const end = control[C_LOG_END]
    if (deadline === undefined) while (this.#cursor < end) this.#applyAt(this.#cursor)
    else for (let n = 1; this.#cursor < end && ((n & 63) !== 0 || performance.now() < deadline); n++) this.#applyAt(this.#cursor)
    // The removals just replayed have cleared their tags; one whose thread stopped before moving
    // the epoch to its own is finished here (docs/reclamation.md, "Removal").
    if (this.#picture.owedEpoch !== 0) catchUpEpoch(this.memory, this.#picture.owedEpoch)
    this.#picture.owedEpoch = 0
    // So are the shared counts a registration stopped between its entry and its count left behind
    // (the lock taken over from it, memory.ts lock(); or it threw, #appendCounted). Under this lock
    // and caught up, every topic and group this thread knows is alive and owns its block.
    if (this.#cursor < end) return false
    if (control[C_RECOUNT] !== 0) {
      for (const topic of this.#picture.topicsById.values()) {
        this.#storeShared(topic.slot + T_PARTITIONS, topic.partitionNumbers.length)
        for (const group of topic.groups) this.#storeShared(group.slot + G_WINDOWED, group.windowPartitions.length)
      }
      control[C_RECOUNT] = 0
    }
    return true
  }

  // ---- registration (each under the lock, after catching up with the log) ----

  topic(name: string): TopicEntity {
    const known = this.topics.get(name)
    // Another thread may have removed it (its liveness tag is 0 at once) before this thread
    // replayed the removal: then take the lock, whose sync applies the removal, and resolve again.
    if (known && this.isLive(known)) return known
    return this.#locked(() => {
      const again = this.topics.get(name)
      if (again) return again
      if (this.topics.size >= this.config.max_topics) {
        throw new LimitError('max_topics', `cannot register topic ${JSON.stringify(name)}: max_topics (${this.config.max_topics}) reached; raise max_topics in the configuration, or remove a topic no longer in use (surface.removeTopic())`)
      }
      this.#room([entryLength(3, name)], [KEY_TOPIC], () => `topic ${JSON.stringify(name)}`)
      const id = this.#nextId()
      const slot = this.#blocks.allocate(KEY_TOPIC)
      // The liveness tag must be set before the entry is published (handles compare it to the id).
      this.#setTag(slot, id)
      this.#append(Entry.Topic, [...wide(id), slot], name)
      return this.#picture.topicsById.get(id)!
    })
  }

  /**
   * The surface closed: from now on every handle, in every thread, throws ClosedError on its next
   * call (each live topic's and group's liveness tag is cleared, the check every recording call
   * makes already), and nothing registers any more (#locked). Idempotent.
   */
  close(): void {
    this.memory.lock()
    try {
      this.#catchUp()
      this.memory.control[C_CLOSED] = 1
      for (const topic of this.topics.values()) {
        this.#setTag(topic.slot, 0)
        for (const group of topic.groups) this.#setTag(group.slot, 0)
      }
    } finally {
      this.memory.unlock()
    }
    ring(this.memory) // every thread's wait for the next removal (reclamation.ts) ends
  }

  /** The surface was closed (by any thread's view of the shared control block). */
  get closed(): boolean {
    return this.memory.control[C_CLOSED] === 1
  }

  removeTopic(name: string): boolean {
    return this.#locked(() => {
      const topic = this.topics.get(name)
      if (!topic) return false
      // Published first, with the epoch it is about to start; applying it clears the tags; then
      // the epoch moves: a thread that reads the new epoch sees the cleared tags. A thread stopped
      // before the publication removed nothing; one stopped after it leaves the rest to the next
      // thread that catches up with the log (#catchUp), before any later epoch can start. From
      // nextEpoch() to advanceEpoch() the lock must be this thread's alone, as for any registration
      // (lock.ts: taken from a holder only once it is gone, or unknown for LOCK_STEAL_MS).
      const keep = this.#picture.liveWithLabel(topic.label).length > 1 ? 1 : 0 // its label's series stays: it retires into the carry
      this.#capacity.roomToRemove(keep === 1 ? topicRetirementInts(topic) : 0)
      const epoch = nextEpoch(this.memory)
      this.#append(Entry.RemoveTopic, [...wide(topic.id), ...wide(epoch), keep])
      advanceEpoch(this.memory, epoch)
      this.reclaim()
      return true
    })
  }

  /**
   * Removes one group of a live topic: its series leave the next scrape; its delivered, dropped
   * and dlq stay in the topic's counters (they retire into them once no call can still land).
   */
  removeGroup(topic: TopicEntity, name: string): boolean {
    return this.#locked(() => {
      this.#assertAlive(topic)
      const group = topic.group(name)
      if (!group) return false
      const carries = this.#picture.groupLabelLive(topic.label, group.label, group) ? 1 : 0 // its label's series stays: its retries with it
      this.#capacity.roomToRemove(entryLength(10) + (carries === 1 ? entryLength(6, group.label) : 0)) // its Retired entry and its retries' carry, amounts below 2^62
      const epoch = nextEpoch(this.memory) // as removeTopic()
      // Marked before the removal is published: a remover stopped in between leaves a mark and no
      // removal (the retries series go for LEFT_MS), never a removal no scrape can tell. One whose
      // label's series stays (carries) too: what it delivered stays in the topic's counters all the same.
      this.#sharedF64(topic.slot)[(topic.slot % SLOTS_PER_CHUNK) + T_GROUP_LEFT] = leftClock.now()
      this.#append(Entry.RemoveGroup, [...wide(group.id), ...wide(epoch), carries])
      advanceEpoch(this.memory, epoch)
      this.reclaim()
      return true
    })
  }

  /** Retires the removed groups and topics no call can still write into (the reader calls it before a read). Caller locks. */
  reclaim(): void {
    if (!this.#retirementsPending()) return
    try {
      this.#retirePassed()
    } catch (error) {
      // A full log takes no retirement: those due wait (each is written whole or not at all), so
      // that a read, or the allocation of a registration LogCapacity.room() let through, never fails on them.
      if (!(error instanceof LimitError)) throw error
    }
  }

  /** Whether a removed group or topic still waits to retire. */
  #retirementsPending(): boolean {
    return this.#picture.retiring.length !== 0 || this.#picture.retiringTopics.size !== 0
  }

  /** The topics retiring into their label's carry (Picture.retiringTopics). */
  retiringTopics(): IterableIterator<TopicEntity> {
    return this.#picture.retiringTopics.values()
  }

  /** The topics with `label` retiring into its carry (none: an empty array). */
  retiringWithLabel(label: string): readonly TopicEntity[] {
    return this.#picture.retiringWithLabel(label)
  }

  /** The live topics with `label` (none: an empty array). */
  liveWithLabel(label: string): readonly TopicEntity[] {
    return this.#picture.liveWithLabel(label)
  }

  /** The slot of `partition`'s last_seq, registering the partition if it is new. */
  partition(topic: TopicEntity, partition: number): number {
    const known = topic.partitionSlot(partition)
    if (known !== undefined) return known
    return this.#locked(() => {
      this.#assertAlive(topic)
      const again = topic.partitionSlot(partition)
      if (again !== undefined) return again
      if (topic.partitionNumbers.length >= this.config.max_partitions_per_topic) {
        throw new LimitError('max_partitions_per_topic', `cannot register partition ${partition} of topic ${JSON.stringify(topic.name)}: max_partitions_per_topic (${this.config.max_partitions_per_topic}) reached; raise max_partitions_per_topic in the configuration`)
      }
      this.#room([entryLength(4)], [KEY_PARTITION], () => `partition ${partition} of topic ${JSON.stringify(topic.name)}`)
      const slot = this.#blocks.allocate(KEY_PARTITION)
      this.#storeShared(topic.slot + T_PARTITIONS, topic.partitionNumbers.length + 1) // entities.ts: before the entry
      this.#appendCounted(Entry.Partition, [...wide(topic.id), partition, slot])
      return topic.partitionSlot(partition)!
    })
  }

  /**
   * The group named `name`, registered if it is new, starting at `start` (design §4): at each
   * partition's start (`'earliest'`), at each known partition's last_seq (`'latest'`), or at the
   * floors given by partition (committed: each from the partition's base to its last_seq, checked
   * here, under the registration lock, before anything is written: RangeError, nothing registered).
   * Its floors are set there, and its balance at registration is what those floors skip.
   */
  group(topic: TopicEntity, name: string, maxInFlight: number, window = DEFAULT_SETTLE_WINDOW, start: Start = 'earliest'): GroupEntity {
    const known = topic.group(name)
    if (known && this.isGroupLive(known)) return known
    return this.#locked(() => {
      this.#assertAlive(topic)
      const again = topic.group(name)
      if (again) return again
      if (topic.groupsByName.size >= this.config.max_groups_per_topic) {
        throw new LimitError('max_groups_per_topic', `cannot register group ${JSON.stringify(name)} on topic ${JSON.stringify(topic.name)}: max_groups_per_topic (${this.config.max_groups_per_topic}) reached; raise max_groups_per_topic in the configuration, or remove a group no longer in use (topic.removeGroup())`)
      }
      const floors = this.#startFloors(topic, name, start)
      this.#room([entryLength(7, name), ...floors.map(() => entryLength(4))], [KEY_GROUP, ...floors.map(() => KEY_FLOOR)], () => `group ${JSON.stringify(name)} on topic ${JSON.stringify(topic.name)}`)
      const id = this.#nextId()
      const slot = this.#blocks.allocate(KEY_GROUP)
      const entries: [Entry, number[], string?][] = [[Entry.Group, [...wide(topic.id), ...wide(id), slot, maxInFlight, window], name]]
      if (floors.length !== 0) {
        // Its floors (blocks, values) and its starting balance are written first, the group and
        // its floors then published with one store: a thread stopped before that registered
        // nothing, and no thread sees the group without them.
        let skipped: Count = 0
        let queued = 0 // floor blocks taken from the front of the free queue so far (the replay's take drops them at publication: picture.ts)
        for (const { partition, floor, base } of floors) {
          const floorSlot = this.#blocks.allocate(KEY_FLOOR, queued)
          if (this.#blocks.queuedAt(KEY_FLOOR, queued, floorSlot)) queued++
          this.#sharedF64(floorSlot)[floorSlot % SLOTS_PER_CHUNK] = floor
          entries.push([Entry.Floor, [...wide(id), partition, floorSlot]])
          skipped = addCount(skipped, floor - base)
        }
        const exact = BigInt(skipped)
        this.#sharedF64(slot)[(slot % SLOTS_PER_CHUNK) + G_START] = Number(exact % 2n ** 32n)
        this.#sharedF64(slot)[(slot % SLOTS_PER_CHUNK) + G_START_HIGH] = Number(exact / 2n ** 32n)
      }
      this.#setTag(slot + G_TAG, id)
      this.#appendAll(entries)
      return this.#picture.groupsById.get(id)!
    })
  }

  /**
   * The floors a new group starts with, by partition (only those above the partition's base),
   * read under the registration lock. A committed floor outside [base, last_seq] is refused:
   * above last_seq it would settle messages not appended yet, below the base it would owe
   * messages never counted as produced.
   */
  #startFloors(topic: TopicEntity, name: string, start: Start): { partition: number; floor: number; base: number }[] {
    const floors: { partition: number; floor: number; base: number }[] = []
    if (start === 'earliest') return floors
    const what = () => `group ${JSON.stringify(name)} of topic ${JSON.stringify(topic.name)}`
    const at = (p: number) => {
      const slot = topic.partitionSlots[p]
      return { lastSeq: this.highest(slot), base: this.#sharedF64(slot)[(slot % SLOTS_PER_CHUNK) + P_BASE] }
    }
    if (start === 'latest') {
      for (let p = 0; p < topic.partitionNumbers.length; p++) {
        const { lastSeq, base } = at(p)
        if (lastSeq > base) floors.push({ partition: topic.partitionNumbers[p], floor: lastSeq, base })
      }
      return floors
    }
    for (const [partition, floor] of start) {
      const p = topic.partitionNumbers.indexOf(partition)
      const { lastSeq, base } = p === -1 ? { lastSeq: 0, base: 0 } : at(p)
      if (floor > lastSeq) {
        throw new RangeError(`${what()} cannot start at seq ${floor} of partition ${partition}: its last_seq is ${lastSeq} (a group starts at most at last_seq)`)
      }
      if (floor < base) {
        throw new RangeError(`${what()} cannot start at seq ${floor} of partition ${partition}: the partition's counts start after seq ${base}, so the messages from ${floor + 1} to ${base} were never counted as produced (start the partition's counts at the lowest committed seq: docs/integration.md)`)
      }
      if (floor > base) floors.push({ partition, floor, base })
    }
    return floors
  }

  /** The highest value any thread holds in `slot` (a last_seq or a floor), its shared hint included. */
  highest(slot: number): number {
    const c = Math.floor(slot / SLOTS_PER_CHUNK)
    const at = slot % SLOTS_PER_CHUNK
    const hint = this.#sharedF64(slot)[at]
    let max = hint > 0 ? hint : 0
    for (let row = 1; row < this.memory.rowCount(); row++) {
      const value = this.memory.rowChunk(row, c, false)?.[at]
      if (value !== undefined && value > max) max = value
    }
    return max
  }

  /**
   * A partition's first batch when it starts above seq 1 (a resumed log; design §4): `append`
   * writes it — its base, counts and last_seq — under the registration lock, unless the partition
   * has a base or a message already (false: another thread's first batch came first).
   */
  firstAppend(topic: TopicEntity, slot: number, append: () => void): boolean {
    return this.#locked(() => {
      this.#assertAlive(topic)
      if (this.#sharedF64(slot)[(slot % SLOTS_PER_CHUNK) + P_BASE] !== 0 || this.highest(slot) !== 0) return false
      append()
      return true
    })
  }

  /**
   * #append() for a registration with a shared count (entities.ts G_WINDOWED): one that throws
   * (the log full, out of memory, perhaps after publishing) leaves its count for the next catch-up
   * to write anew, as a thread stopped there would. Caller locks.
   */
  #appendCounted(type: Entry, fields: number[]): void {
    try {
      this.#append(type, fields)
    } catch (error) {
      this.memory.control[C_RECOUNT] = 1
      throw error
    }
  }

  /**
   * Refuses a registration whose log entries (`lengths`) the registration log, or whose blocks
   * (`keys`) the counter memory, has no room for: LimitError `registration_log` (log-capacity.ts
   * room, which writes the retirements due first) or `counter_memory` (Blocks.fit; a block freed
   * by a removal is reused once it has retired), nothing registered. Caller locks.
   */
  #room(lengths: number[], keys: readonly number[], what: () => string): void {
    this.#capacity.room(lengths, what)
    if (this.#blocks.fit(keys)) return
    const chunks = this.#blocks.maxChunks
    const mib = (chunks * SLOTS_PER_CHUNK * 8) / 2 ** 20
    throw new LimitError('counter_memory', `${what()}: the counter memory is full (${chunks} chunks of 64 KiB, ${mib >= 1024 ? `${mib / 1024} GiB` : `${mib} MiB`}, for the cells of every live topic, partition, group, ack floor and settlement window; a window of W seqs takes W/4 bytes); nothing was registered. Remove topics or groups no longer in use (their room is reused once they have retired), or give groups a smaller settle_window (docs/operations.md)`)
  }

  /** An Int32 count in the shared row at `slot` (entities.ts T_PARTITIONS, G_WINDOWED). Caller locks. */
  #storeShared(slot: number, value: number): void {
    Atomics.store(this.memory.sharedI32(Math.floor(slot / SLOTS_PER_CHUNK)), (slot % SLOTS_PER_CHUNK) * 2, value)
  }

  /** The slot of this group's settlement window on `partition`, registering it if it is new. */
  windowBlock(group: GroupEntity, partition: number): number {
    const known = group.windowSlot(partition)
    if (known !== undefined) return known
    return this.#locked(() => {
      this.#assertGroupAlive(group)
      const again = group.windowSlot(partition)
      if (again !== undefined) return again
      this.#room([entryLength(5)], [windowKey(group.window), KEY_HEADER], () => `the settlement window of group ${JSON.stringify(group.name)} on partition ${partition}`)
      const slot = this.#blocks.allocate(windowKey(group.window))
      const header = this.#blocks.allocate(KEY_HEADER)
      this.#appendCounted(Entry.Window, [...wide(group.id), partition, slot, header])
      this.#storeShared(group.slot + G_WINDOWED, group.windowPartitions.length) // entities.ts: after the entry
      return group.windowSlot(partition)!
    })
  }

  floor(group: GroupEntity, partition: number): number {
    const known = group.floorSlot(partition)
    if (known !== undefined) return known
    return this.#locked(() => {
      this.#assertGroupAlive(group)
      const again = group.floorSlot(partition)
      if (again !== undefined) return again
      this.#room([entryLength(4)], [KEY_FLOOR], () => `the ack floor of group ${JSON.stringify(group.name)} on partition ${partition}`)
      const slot = this.#blocks.allocate(KEY_FLOOR)
      this.#append(Entry.Floor, [...wide(group.id), partition, slot])
      return group.floorSlot(partition)!
    })
  }

  /**
   * Moves a row cell's whole value into the log, exactly (the cell nears 2^53; it is 0 after).
   * `group`: the group whose cell it is (checked too: a removed group's blocks are not its own
   * any more). Whole or not made (design §11): the entry is written first, unpublished; then the
   * cell gives the amount up and the entry is published, two plain stores with no call between.
   * A terminated thread stops at a call (a builtin's too: Atomics.store is one) or a loop's back
   * edge, never between two plain stores; the log's readers read it under the registration lock,
   * whose release orders the stores for them. A total never changes with a fold, so a caller that
   * folds before its own writes leaves its call not made if it stops after.
   */
  fold(row: Float64Array, index: number, slot: number, topic: TopicEntity, group?: GroupEntity): void {
    this.#locked(() => {
      // Removed while this thread waited for the lock: its slots are not its own.
      if (group === undefined) this.#assertAlive(topic)
      else this.#assertGroupAlive(group)
      const amount = row[index]
      const control = this.memory.control
      this.#capacity.mustFit([entryLength(3)], 'cannot fold a counter near 2^53 into the registration log')
      const end = this.#log.write(this.#logGeneration, control[C_LOG_END], Entry.Fold, [slot, ...wide(amount)])[1]
      row[index] -= amount
      control[C_LOG_END] = end
      this.#published(end)
    })
  }

  /** Σ of a slot over every thread row and its folds, exactly (a reader of cells no call writes any more). */
  exactSum(slot: number): bigint {
    const c = Math.floor(slot / SLOTS_PER_CHUNK)
    const at = slot % SLOTS_PER_CHUNK
    let sum = this.folds.get(slot) ?? 0n
    for (let row = 1; row < this.memory.rowCount(); row++) {
      const chunk = this.memory.rowChunk(row, c, false)
      if (chunk !== undefined) sum += BigInt(chunk[at])
    }
    return sum
  }

  #assertAlive(topic: TopicEntity): void {
    // The handle's own liveness check passed, then the removal landed before the lock: the same
    // error as if it had landed first (a broker that catches RemovedTopicError re-resolves).
    if (!topic.alive) throw new RemovedTopicError(topic.name)
  }

  #assertGroupAlive(group: GroupEntity): void {
    this.#assertAlive(group.topic)
    if (!group.alive) throw new RemovedGroupError(group.topic.name, group.name)
  }

  /** `fn` under the registration lock, the registry synced: a reader that must not see a fold half made. */
  whileSynced<T>(fn: () => T): T {
    this.memory.lock()
    try {
      this.#catchUp()
      return fn()
    } finally {
      this.memory.unlock()
    }
  }

  /** whileSynced() for a registration: refused once the surface is closed. */
  #locked<T>(fn: () => T): T {
    return this.whileSynced(() => {
      if (this.memory.control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
      return fn()
    })
  }

  /** Ids are never reused (64-bit counter; a `number`, exact far beyond any surface's life). */
  #nextId(): number {
    return Number(Atomics.add(this.memory.wide, B_NEXT_ID, 1n))
  }

  /** The live topic of this id, as of the last sync (ids are never reused). */
  topicById(id: number): TopicEntity | undefined {
    return this.#picture.topicsById.get(id)
  }

  /** The topic's shared liveness tag still names it: not removed by any thread. */
  isLive(topic: TopicEntity): boolean {
    return topic.alive && this.#sharedF64(topic.slot)[topic.slot % SLOTS_PER_CHUNK] === topic.id
  }

  /** The group's shared liveness tag still names it: neither it nor its topic removed by any thread. */
  isGroupLive(group: GroupEntity): boolean {
    return group.alive && this.#sharedF64(group.slot)[(group.slot % SLOTS_PER_CHUNK) + G_TAG] === group.id
  }

  #setTag(slot: number, value: number): void {
    this.#sharedF64(slot)[slot % SLOTS_PER_CHUNK] = value
  }

  /** The shared row's chunk holding `slot` (chunks are never unmapped: each is looked up once). */
  #sharedF64(slot: number): Float64Array {
    const c = Math.floor(slot / SLOTS_PER_CHUNK)
    return this.#sharedChunks[c] ?? (this.#sharedChunks[c] = this.memory.rowChunk(SHARED_ROW, c, true)!)
  }

  /** Whether every other thread is past `epoch` (reclamation.ts). Caller locks. */
  #hasPassed(epoch: number): boolean {
    if (epoch <= this.#passed) return true
    const now = Date.now()
    const askProc = now - this.#goneCheckedAt >= GONE_CHECK_MS
    if (askProc) this.#goneCheckedAt = now
    this.#passed = passedEpoch(this.memory, askProc)
    return epoch <= this.#passed
  }

  /**
   * Retiring groups whose epoch has passed: their final counts move into their topics (and their
   * retries into their label's carry, if their removal said so: GroupEntity.carries). Retiring topics whose
   * epoch has passed: their final counts move into their label's carry. Caller locks.
   */
  #retirePassed(): void {
    // Both in epoch order (removals are appended in epoch order; a checkpoint's are sorted); each
    // retirement takes its topic or group out, so the first one is looked at until one has not passed.
    for (let topic = first(this.#picture.retiringTopics); topic !== undefined && this.#hasPassed(topic.retireEpoch); topic = first(this.#picture.retiringTopics)) {
      this.#appendAll([...this.#topicCarry(topic), [Entry.TopicRetired, wide(topic.id)]])
    }
    while (this.#picture.retiring.length > 0) {
      const group = this.#picture.retiring[0]
      if (!this.#hasPassed(group.retireEpoch)) break
      const slot = group.slot
      // Amounts past an entry's 64 bits go first in entries of the topic alone; the group's own
      // entry, last, retires it. All are published at once: a thread stopped before that leaves none.
      const rows = amountRows([this.exactSum(slot + G_DELIVERED), this.exactSum(slot + G_DROPPED), this.exactSum(slot + G_DLQ)])
      const carried = group.carries ? carryEntries(group.topic.id, CarryKind.Retries, 0, this.exactSum(slot + G_RETRIES), group.label) : []
      this.#appendAll([...carried, ...rows.map((amounts, r): [Entry, number[]] => [Entry.Retired, [
        ...wide(group.topic.id), ...(r === rows.length - 1 ? wide(group.id) : [0, 0]), ...amounts.flatMap((a) => wide(a)),
      ]])])
    }
  }

  /**
   * The entries that move a retiring topic's final counts into its label's carry: its counters;
   * its last_seq on the partitions whose series stays (carriedPartitions); its groups' retries
   * where theirs does (GroupEntity.carries). Caller locks.
   */
  #topicCarry(topic: TopicEntity): [Entry, number[], string?][] {
    const groups = [...topic.groups, ...topic.retiring]
    const sum = (cell: number, retired: Count) => groups.reduce((total, group) => total + this.exactSum(group.slot + cell), BigInt(retired))
    const entries = [
      ...carryEntries(topic.id, CarryKind.Produced, 0, this.exactSum(topic.slot)),
      ...carryEntries(topic.id, CarryKind.Bytes, 0, this.exactSum(topic.slot + 1)),
      ...carryEntries(topic.id, CarryKind.Delivered, 0, sum(G_DELIVERED, topic.retiredDelivered)),
      ...carryEntries(topic.id, CarryKind.Dropped, 0, sum(G_DROPPED, topic.retiredDropped)),
      ...carryEntries(topic.id, CarryKind.Dlq, 0, sum(G_DLQ, topic.retiredDlq)),
    ]
    topic.partitionNumbers.forEach((partition, p) => {
      const lastSeq = this.highest(topic.partitionSlots[p])
      if (lastSeq > 0 && topic.carriedPartitions!.has(partition)) entries.push(...carryEntries(topic.id, CarryKind.LastSeq, partition, BigInt(lastSeq)))
    })
    const retries = new Map<string, bigint>()
    for (const group of groups) if (group.carries) retries.set(group.label, (retries.get(group.label) ?? 0n) + this.exactSum(group.slot + G_RETRIES))
    for (const [label, amount] of retries) entries.push(...carryEntries(topic.id, CarryKind.Retries, 0, amount, label))
    return entries
  }

  /** Appends one entry, publishes it with a single store, and applies it locally. Caller locks and has synced. */
  #append(type: Entry, fields: number[], text?: string): void {
    this.#appendAll([[type, fields, text]])
  }

  /** Appends entries and publishes them with one store. Caller locks and has synced. */
  #appendAll(entries: [Entry, number[], string?][]): void {
    const control = this.memory.control
    let end = control[C_LOG_END]
    // Past the log's end nothing is written: what the reserve (LogCapacity room, roomToRemove) cannot take is refused whole.
    this.#capacity.mustFit(entries.map(([, fields, text]) => entryLength(fields.length, text)), 'cannot write to the registration log')
    let texts: Map<number, string> | undefined
    for (const [type, fields, its] of entries) {
      const [position, next] = this.#log.write(this.#logGeneration, end, type, fields, its)
      if (its !== undefined) (texts ??= new Map()).set(position, its)
      end = next
    }
    Atomics.store(control, C_LOG_END, end)
    this.#published(end, texts)
  }

  /** Entries just published (up to `end`, with the texts they hold by position): applied locally, the log compacted when due. */
  #published(end: number, texts?: Map<number, string>): void {
    while (this.#cursor < end) this.#applyAt(this.#cursor, texts)
    if (this.#capacity.compactionDue()) this.compact()
  }

  /** Replays the entry at `position` into this thread's picture (`texts`: those of the entries this thread appended, by position). */
  #applyAt(position: number, texts?: Map<number, string>): void {
    const entry = this.#log.at(this.#logGeneration, position)
    this.#cursor = entry.next
    // A generation after the first starts with its checkpoint (C_LOG_CHECKPOINT: where it ends).
    this.#picture.apply(position, entry, position < this.memory.control[C_LOG_CHECKPOINT], texts)
  }

  /**
   * Writes everything alive as the checkpoint of a new log generation (in the other directory,
   * whose chunks the generation before last used) and publishes it: the log is bounded by the
   * live state, and a thread that attaches later replays that, not the history. Caller locks and
   * has synced (also called directly by tests).
   */
  compact(): boolean {
    // Measured first: a checkpoint that would not fit the log is not written (the log goes on as
    // it is, and is not measured again until a quarter of the reserve more has been freed or written).
    if (checkpoint(this.#picture, this.#blocks, (length, end) => endAfter(end, [length])) > this.#capacity.logCapacityInts) {
      this.#capacity.tooLargeToCompact()
      return false
    }
    const next = this.#logGeneration + 1
    const end = checkpoint(this.#picture, this.#blocks, (length, end, type, fields, text) => this.#log.write(next, end, type, fields, text)[1])
    const control = this.memory.control
    // Published by three plain stores with no call between (a terminated thread never stops
    // between them; see fold()): an end of one generation never stands with the other.
    control[C_LOG_CHECKPOINT] = end
    control[C_LOG_END] = end
    control[C_LOG_GENERATION] = next
    // This thread's picture is the checkpoint it just wrote.
    this.#logGeneration = next
    this.#cursor = end
    this.#capacity.restart()
    return true
  }

  /** Slots handed out and not freed (for the soak test's leak check). */
  slotsInUse(): number {
    return this.memory.control[C_SLOTS_RESERVED] - this.#blocks.freed().slots
  }

  /**
   * Memory the registry holds in the arena, for leak checks: slots in use and ever handed out
   * (freed blocks are reused, so this stops growing once churn reaches a steady state), freed
   * blocks waiting for reuse, arena chunks allocated, the registration log's length in bytes
   * (compacted: bounded by what is alive and the freed blocks, one place each in a checkpoint's Free entries), and
   * thread rows claimed (the main thread's included; rows of exited threads are reused, so this
   * counts threads alive at once, not attaches).
   */
  arenaUsage(): ArenaUsage {
    const control = this.memory.control
    const freed = this.#blocks.freed()
    return {
      threadRows: this.memory.rowCount() - 1, // row 0 is the shared row, not a thread
      slotsInUse: control[C_SLOTS_RESERVED] - freed.slots,
      slotsReserved: control[C_SLOTS_RESERVED],
      freeBlocks: freed.blocks,
      chunks: Atomics.load(control, C_NEXT_CHUNK),
      logBytes: Atomics.load(control, C_LOG_END) * 4,
    }
  }
}

/** The first value of a map (in insertion order), or undefined. */
function first<V>(map: ReadonlyMap<number, V>): V | undefined {
  for (const value of map.values()) return value
  return undefined
}

