// The read side: one Snapshot of every live series, summed over the thread rows. Taken under
// the registration lock, so a topic is either wholly registered or absent, never torn, and no
// removal or fold can interleave with the read. The registry keeps each topic's partitions,
// floors and groups as sorted arrays, so a read needs no per-topic layout of its own.
import { SHARED_ROW, SLOTS_PER_CHUNK } from './layout'
import { Memory } from './memory'
import { floorMovedBit, G_DELIVERED, G_DLQ, G_DROPPED, G_FLOOR_MOVED_INT32, G_IN_FLIGHT, G_LOCK, G_RETRIES, G_START, G_START_HIGH, G_WINDOWED, P_BASE, T_GROUP_LEFT, W_PENDING, W_SETTLED, GroupEntity, TopicEntity } from './entities'
import { leftClock, leftLately } from './left'
import { release } from './lock'
import { finishWindows } from './window'
import { Registry } from './registry'
import { Carried, Count, GroupSnapshot, Layout, MAX_SAFE, TopicSnapshot, addCount, hasNoCollisions } from './snapshot'

const ZERO_ROWS: Float64Array[] = []
/** Loads of a held group lock before its holder is asked after (~2 µs: a live holder's call is shorter, unless descheduled). */
const KEPT_SPINS = 1000

// A slot's chunk and its index in it (slots are < 2^31; SLOTS_PER_CHUNK is 2^13).
const enum Chunk {
  Shift = 13,
  Mask = (1 << 13) - 1,
}
if (1 << Chunk.Shift !== SLOTS_PER_CHUNK) throw new Error('internal: Chunk.Shift does not match SLOTS_PER_CHUNK')

export class SnapshotReader {
  /**
   * @internal Test-only: called in each topic's read after its last_seq cells are read
   * (`'lastSeq'`), and after its groups' counters but before the topic's own produced and bytes
   * counters are read (`'counters'`), so that a test can park a producer between its writes at
   * those points (test/lifecycle-edges.test.js). Unset in use.
   */
  static parkAt: ((point: 'lastSeq' | 'counters', topic: string) => void) | undefined = undefined
  readonly #registry: Registry
  readonly #memory: Memory
  // Per slot chunk (index = chunk number), rebuilt per read: the thread rows (≥ 1) that have it,
  // and the shared row's chunk. Arrays, not Maps: a 187k-sample read makes ~260k cell reads.
  #rows: (Float64Array[] | undefined)[] = []
  #shared: (Float64Array | undefined)[] = []
  #sharedI32: (Int32Array | undefined)[] = []
  #rowCount = 0
  /** left.ts's clock at the start of the slice being read. */
  #now = 0
  #sortedTopics: TopicEntity[] = []
  #sortedAt = -1
  #layout: Layout = { collisionFree: true }
  /** Per group index: floors read only to derive depth and lag (see #topic), reused across reads. */
  readonly #scratchFloors: Float64Array[] = []
  readonly #scratchRows: Float64Array[] = []
  /** Groups whose in_flight read below 0 (more settled than dispatched): the surface repairs them. */
  underflows: GroupEntity[] = []
  /** Group slot → the tag its lock was held with at the last read that found it held. */
  readonly #held = new Map<number, number>()
  /** The slots of #held found held again by the read under way (topics()). */
  readonly #heldNow = new Set<number>()
  /** #locksHeld took a gone thread's lock over during the read under way: #topic reads it again. */
  #repaired = false

  /**
   * `checkOnly`: a reader for the conservation check alone (/healthz), which reads neither the
   * topics' order nor what removed names carried: it lists them in the order this thread learnt
   * them, unsorted, and reads no carry. A broker with dynamic topics changes names between any two
   * probes, and sorting 20,000 topics and looking for collisions held the thread ~6–8 ms a probe.
   */
  constructor(registry: Registry, readonly checkOnly = false) {
    this.#registry = registry
    this.#memory = registry.memory
  }

  /**
   * Every live topic, ascending by label then raw name (a checkOnly reader's: unsorted, nothing
   * carried); with `ackFloors`, each group's floors too. Caller holds the lock and has synced.
   */
  topics(ackFloors = false): TopicSnapshot[] {
    const sorted = this.beginSliced()
    const out: TopicSnapshot[] = []
    if (sorted.length !== 0) this.slice(sorted, 0, out, Infinity, ackFloors)
    this.endSliced()
    return out
  }

  /**
   * A read in slices, each under a hold of the lock of its own (Observer.observeSliced): the live
   * topics, in order (a checkOnly reader's: unsorted), to read with slice(); endSliced() once every slice is read. Caller holds
   * the lock and has synced. `sort` false: the list sortAhead() made, as this thread knew the
   * topics then (Observer, the scrape thread: a topic registered since is read by the next read,
   * as one registered between two slices is).
   */
  beginSliced(sort = true): readonly TopicEntity[] {
    this.#beginRead()
    if (sort) this.sortAhead()
    return this.#sortedTopics
  }

  /**
   * The live topics sorted (a checkOnly reader's: listed, unsorted), if what this thread knows
   * changed since the last sort: beginSliced() then finds them sorted. Reads only this thread's picture, so a caller that does not sync
   * meanwhile may call it with the lock free (Observer, the scrape thread).
   */
  sortAhead(): void {
    const registry = this.#registry
    if (this.#sortedAt !== registry.generation) {
      this.#sortedAt = registry.generation
      if (this.checkOnly) {
        this.#sortedTopics = [...registry.topics.values()]
        this.#layout = { collisionFree: false } // not looked for (one object per generation, as any layout)
        return
      }
      this.#sortedTopics = [...registry.topics.values()].sort(byLabelThenName)
      this.#layout = { collisionFree: hasNoCollisions(this.#sortedTopics) && !this.#carrying() }
    }
  }

  /**
   * Reads `sorted[from…]` into `out` (with `ackFloors`, each group's floors too) until `deadline`
   * (performance.now()) has passed, one topic at least; returns the index to go on from. A topic removed since beginSliced() is left out.
   * Caller holds the lock and has synced since its last hold: what another thread registered,
   * folded or removed meanwhile is in this thread's picture, and a topic removed meanwhile fails
   * isLive() even if its block was reused (ids are never reused).
   */
  slice(sorted: readonly TopicEntity[], from: number, out: TopicSnapshot[], deadline: number, ackFloors = false): number {
    this.#caches()
    let t = from
    let label: string | undefined
    do {
      const topic = sorted[t]
      if (this.#registry.isLive(topic)) {
        const snapshot = this.#topic(topic, ackFloors)
        // The first live topic of its label carries what removed names left in the label's series
        // (only where names collide: a carry is left only by the removal of a colliding name).
        if (!this.checkOnly && !this.#layout.collisionFree && topic.label !== label) {
          label = topic.label
          const carried = this.#carried(label)
          if (carried !== undefined) snapshot.carried = carried
        }
        out.push(snapshot)
      }
      t++
      // A label's topics are read in one hold: a removal between two holds would count a topic
      // read live in the first as retiring in the second (twice in one series). (A checkOnly
      // reader's list is unsorted: it reads no carry, and each topic is checked on its own.)
    } while (t < sorted.length && (deadline === Infinity || sorted[t].label === sorted[t - 1].label || performance.now() < deadline))
    return t
  }

  /** Whether any label's series has something carried (a retiring or retired topic, or a group's). */
  #carrying(): boolean {
    const registry = this.#registry
    if (registry.carries.size !== 0 || !registry.retiringTopics().next().done) return true
    for (const topic of registry.topics.values()) for (const group of topic.retiring) if (group.carries) return true
    return false
  }

  /**
   * What removed names left in `label`'s series (design §3.5): the carry they retired into, the
   * cells of the topics still retiring (a late call may still land there), and the retries of the
   * label's retiring groups whose share stays (GroupEntity.carries). undefined: nothing.
   */
  #carried(label: string): Carried | undefined {
    const registry = this.#registry
    const carry = registry.carries.get(label)
    const retiring = registry.retiringWithLabel(label)
    let groups: GroupEntity[] | undefined
    for (const topic of registry.liveWithLabel(label)) for (const group of topic.retiring) if (group.carries) (groups ??= []).push(group)
    if (carry === undefined && retiring.length === 0 && groups === undefined) return undefined
    const carried: Carried & { lastSeq: Map<number, number>; retries: Map<string, Count> } = {
      produced: carry?.produced ?? 0,
      bytes: carry?.bytes ?? 0,
      delivered: carry?.delivered ?? 0,
      dropped: carry?.dropped ?? 0,
      dlq: carry?.dlq ?? 0,
      lastSeq: new Map(carry?.lastSeq),
      retries: new Map(carry?.retries),
    }
    const retries = (group: GroupEntity) => {
      if (group.carries) carried.retries.set(group.label, addCount(carried.retries.get(group.label) ?? 0, this.#count(group.slot + G_RETRIES)))
    }
    for (const topic of retiring) {
      carried.produced = addCount(carried.produced, this.#count(topic.slot))
      carried.bytes = addCount(carried.bytes, this.#count(topic.slot + 1))
      carried.delivered = addCount(addCount(carried.delivered, topic.retiredDelivered), this.#sumOf(topic, G_DELIVERED))
      carried.dropped = addCount(addCount(carried.dropped, topic.retiredDropped), this.#sumOf(topic, G_DROPPED))
      carried.dlq = addCount(addCount(carried.dlq, topic.retiredDlq), this.#sumOf(topic, G_DLQ))
      topic.partitionNumbers.forEach((partition, p) => {
        if (!topic.carriedPartitions!.has(partition)) return
        const seq = this.#max(topic.partitionSlots[p])
        if (seq > (carried.lastSeq.get(partition) ?? 0)) carried.lastSeq.set(partition, seq)
      })
      for (const group of topic.groups) retries(group)
      for (const group of topic.retiring) retries(group)
    }
    for (const group of groups ?? []) retries(group)
    return carried
  }

  /** Σ of one cell over a retiring topic's groups (those removed with it, and those removed before). */
  #sumOf(topic: TopicEntity, cell: number): Count {
    let sum: Count = 0
    for (const group of topic.groups) sum = addCount(sum, this.#count(group.slot + cell))
    for (const group of topic.retiring) sum = addCount(sum, this.#count(group.slot + cell))
    return sum
  }

  /** The end of a read: a group removed (or its topic) while its lock was held is met no more, forgotten here. */
  endSliced(): void {
    if (this.#held.size !== 0) for (const slot of this.#held.keys()) if (!this.#heldNow.has(slot)) this.#held.delete(slot)
    this.#heldNow.clear()
  }

  /** The structure of what the last `topics()` read (one object per registry generation). */
  get layout(): Layout {
    return this.#layout
  }

  /**
   * One topic again (the conservation checker's confirming re-read). The underflows found so far
   * are kept: the read under way repairs them (one found twice is repaired once: the repair
   * re-sums).
   */
  topic(entity: TopicEntity, only?: GroupEntity): TopicSnapshot {
    this.#caches()
    return this.#topic(entity, false, only)
  }

  /** A group's G_FLOOR_MOVED_INT32 cell (entities.ts): the classes of partitions whose floor ackFloor() has moved. Read after its floors. */
  #floorMoved(slot: number): number {
    return Atomics.load(this.#sharedI32Of(slot >>> Chunk.Shift), ((slot & Chunk.Mask) + G_WINDOWED) * 2 + G_FLOOR_MOVED_INT32)
  }

  /**
   * Whether a thread holds one of the topic's groups' locks, checked after each read of its
   * numbers: it is inside a send, settle or dispatch whose writes may be half made, so the read is
   * marked as being written (snapshot.ts `producing`), as a producer between its two writes marks
   * it — a thread stopped there across both reads of the checker is not taken for a broken
   * identity. A lock still held after a short wait, or by the same tag as at the previous read,
   * whose thread is gone (a worker terminated inside the call) is taken over: the floor move it
   * may have left half done is finished (window.ts), the lock freed, and the topic read again
   * (#topic), so that the read that finds it already shows the floor its counts moved.
   */
  #locksHeld(topic: TopicEntity, pending: readonly GroupEntity[] | undefined, only: GroupEntity | undefined): boolean {
    let held = false
    const groups = only === undefined ? topic.groups : [only] // a group judged as it leaves: its own lock
    for (let g = 0; g < groups.length; g++) {
      const slot = groups[g].slot
      const cells = this.#sharedI32Of(slot >>> Chunk.Shift)
      const at = ((slot & Chunk.Mask) + G_LOCK) * 2
      const tag = Atomics.load(cells, at)
      if (tag === 0) {
        if (this.#held.size !== 0) this.#held.delete(slot)
        if (pending !== undefined && pending.includes(groups[g])) {
          // A floor move left pending by a thread that is gone, the lock since taken over and freed
          // by a thread that did not know that window: finished here, under the lock, if it is free.
          held = true
          if (Atomics.compareExchange(cells, at, 0, this.#memory.lockTag) === 0) this.#finish(groups[g], cells, at), (this.#repaired = true)
        }
        continue
      }
      held = true
      this.#heldNow.add(slot)
      // A live holder leaves within a call (microseconds): asked of /proc only if it kept the lock
      // through a short wait, or from the previous read.
      if (this.#held.get(slot) !== tag && !this.#keptThrough(cells, at, tag)) this.#held.set(slot, tag)
      else if (this.#memory.holderState(tag) === 'gone' && Atomics.compareExchange(cells, at, tag, this.#memory.lockTag) === tag) this.#finish(groups[g], cells, at), (this.#repaired = true)
      else this.#held.set(slot, tag)
    }
    return held
  }

  /** Whether `tag` still holds the lock after a short wait (a holder inside its call has left by then). */
  #keptThrough(cells: Int32Array, at: number, tag: number): boolean {
    for (let i = 0; i < KEPT_SPINS; i++) if (Atomics.load(cells, at) !== tag) return false
    return true
  }

  /** The reader took the group's lock over from a thread that is gone: its windows put right, the lock freed. */
  #finish(group: GroupEntity, cells: Int32Array, at: number): void {
    try {
      finishWindows(this.#memory, group)
    } finally {
      this.#held.delete(group.slot)
      release(cells, at, this.#memory.lockTag)
    }
  }

  #beginRead(): void {
    this.#registry.reclaim()
    this.underflows = []
    this.#caches()
  }

  /** Per read (per slice: a thread may have taken a row, a chunk been mapped, since the last). */
  #caches(): void {
    this.#now = leftClock.now()
    this.#rows = []
    this.#shared = []
    this.#sharedI32 = []
    this.#rowCount = this.#memory.rowCount()
  }

  #rowsOf(c: number): Float64Array[] {
    let rows = this.#rows[c]
    if (rows === undefined) {
      rows = []
      for (let row = 1; row < this.#rowCount; row++) {
        const chunk = this.#memory.rowChunk(row, c, false)
        if (chunk !== undefined) rows.push(chunk)
      }
      if (rows.length === 0) rows = ZERO_ROWS
      this.#rows[c] = rows
    }
    return rows
  }

  /** Chunk `c`'s shared row as Int32 cells (locks, flags), cached as #sharedOf caches its Float64 view. */
  #sharedI32Of(c: number): Int32Array {
    return this.#sharedI32[c] ?? (this.#sharedI32[c] = this.#memory.sharedI32(c))
  }

  #sharedOf(c: number): Float64Array {
    let shared = this.#shared[c]
    if (shared === undefined) {
      shared = this.#memory.rowChunk(SHARED_ROW, c, true)!
      this.#shared[c] = shared
    }
    return shared
  }

  #count(slot: number): Count {
    const rows = this.#rowsOf(slot >>> Chunk.Shift)
    const index = slot & Chunk.Mask
    let sum = 0
    for (let r = 0; r < rows.length; r++) sum += rows[r][index]
    const folded = this.#registry.folds.size === 0 ? undefined : this.#registry.folds.get(slot)
    if (sum <= MAX_SAFE && folded === undefined) return unboxed(sum)
    // Past 2^53 a double sum is no longer exact: redo it in bigint (design §2: 64-bit counters).
    let exact = folded ?? 0n
    for (let r = 0; r < rows.length; r++) exact += BigInt(rows[r][index])
    return exact <= BigInt(MAX_SAFE) ? Number(exact) : exact
  }

  /** Plain sum over the rows (a signed cell, far from 2^53). */
  #sum(slot: number): number {
    const rows = this.#rowsOf(slot >>> Chunk.Shift)
    const index = slot & Chunk.Mask
    let sum = 0
    for (let r = 0; r < rows.length; r++) sum += rows[r][index]
    return sum
  }

  /** Highest value any thread wrote (last_seq, ack floors: monotone per thread), and the shared hint. */
  #max(slot: number): number {
    const c = slot >>> Chunk.Shift
    const index = slot & Chunk.Mask
    const rows = this.#rows[c] ?? this.#rowsOf(c)
    const hint = (this.#shared[c] ?? this.#sharedOf(c))[index]
    let max = hint > 0 ? hint : 0 // a last_seq hint may be a NaN (owned) or −0: recording.ts claimLastSeq
    for (let r = 0; r < rows.length; r++) {
      const value = rows[r][index]
      if (value > max) max = value
    }
    return max
  }

  /** A partition's base (entities.ts P_BASE): 0 unless its first append started above seq 1. */
  #base(slot: number): number {
    const c = slot >>> Chunk.Shift
    return (this.#shared[c] ?? this.#sharedOf(c))[(slot & Chunk.Mask) + P_BASE]
  }

  /** Into `floors`: `group`'s ack floor on each of `partitions` (0 where it has none). */
  #floors(group: GroupEntity, partitions: readonly number[], floors: number[] | Float64Array): void {
    const count = partitions.length
    const slots = group.floorSlots
    if (group.floorPartitions === partitions) {
      for (let p = 0; p < count; p++) floors[p] = this.#max(slots[p])
      return
    }
    // A floor on only some partitions (or the topic gained a partition since): walk both in order.
    const floorPartitions = group.floorPartitions
    let f = 0
    for (let p = 0; p < count; p++) {
      while (f < floorPartitions.length && floorPartitions[f] < partitions[p]) f++
      floors[p] = f < floorPartitions.length && floorPartitions[f] === partitions[p] ? this.#max(slots[f]) : 0
    }
  }

  /** Floors read only to derive depth and lag go here, one array per group index, reused. */
  #scratch(g: number, length: number): Float64Array {
    let floors = this.#scratchFloors[g]
    if (floors === undefined || floors.length < length) {
      floors = new Float64Array(Math.max(length, 16))
      this.#scratchFloors[g] = floors
    }
    return floors
  }

  #topic(topic: TopicEntity, ackFloors: boolean, only?: GroupEntity): TopicSnapshot {
    const snapshot = this.#topicOnce(topic, ackFloors, only)
    // A lock a gone thread kept, taken over after the read (#locksHeld): the floor move it left is
    // finished now, and read again, so that this read already shows the floor its counts moved.
    if (!this.#repaired) return snapshot
    this.#repaired = false
    const again = this.#topicOnce(topic, ackFloors, only)
    this.#repaired = false // another gone holder met meanwhile: its move is finished, shown by the next read
    return again
  }

  #topicOnce(topic: TopicEntity, ackFloors: boolean, only?: GroupEntity): TopicSnapshot {
    const numbers = topic.partitionNumbers
    const lastSeqSlots = topic.partitionSlots
    // `only`: that group's numbers alone (a group judged as it leaves: Observer.checkLeaving); the
    // topic's depth and its delivered, dropped and dlq then leave the other groups out.
    const groupEntities = only === undefined ? topic.groups : [only]
    const partitionCount = numbers.length
    const groupCount = groupEntities.length
    // Floors first, then last_seq: both only rise, so depth and lag read this way are never < 0.
    const floors: (number[] | Float64Array)[] = ackFloors ? new Array(groupCount) : this.#scratchRows
    for (let g = 0; g < groupCount; g++) {
      floors[g] = ackFloors ? new Array(partitionCount) : this.#scratch(g, partitionCount)
      this.#floors(groupEntities[g], numbers, floors[g])
    }
    const lastSeq: number[] = new Array(partitionCount)
    const depth: number[] = new Array(partitionCount)
    for (let p = 0; p < partitionCount; p++) {
      const seq = this.#max(lastSeqSlots[p])
      // design §4: a partition whose first message came after seq 1 owes nothing below its base.
      const base = this.#base(lastSeqSlots[p])
      for (let g = 0; g < groupCount; g++) if (floors[g][p] < base) floors[g][p] = base
      lastSeq[p] = seq
      // design §4: what the group that owes the most on the partition still owes (below), or,
      // with no group, everything since the base.
      depth[p] = groupCount === 0 ? seq - base : 0
    }
    SnapshotReader.parkAt?.('lastSeq', topic.name)
    let delivered: Count = 0
    let dropped: Count = 0
    let dlq: Count = 0
    const groups: GroupSnapshot[] = new Array(groupCount)
    let pending: GroupEntity[] | undefined
    for (let g = 0; g < groupCount; g++) {
      const group = groupEntities[g]
      const groupFloors = floors[g]
      let lag = 0
      let groupDepth: Count = 0 // a sum over partitions: past 2^53 a bigint, exact as the counters
      const windows = group.windowPartitions
      for (let p = 0, w = 0; p < partitionCount; p++) {
        let behind = lastSeq[p] - groupFloors[p]
        if (behind > lag) lag = behind
        if (windows.length !== 0) {
          // design §4: what the group settled above its floor it no longer owes. Read after the
          // floor (a settlement writes its count first), so this never goes below 0.
          while (w < windows.length && windows[w] < numbers[p]) w++
          if (w < windows.length && windows[w] === numbers[p]) {
            const slot = group.windowHeaders[w]
            const header = this.#shared[slot >>> Chunk.Shift] ?? this.#sharedOf(slot >>> Chunk.Shift)
            const at = slot & Chunk.Mask
            // Seqs settled above the floor (W_SETTLED); a floor move recorded, not finished (W_PENDING: #locksHeld).
            behind -= Math.min(behind, header[at + W_SETTLED])
            if (header[at + W_PENDING] !== 0) (pending ??= []).push(group)
          }
        }
        groupDepth = addCount(groupDepth, behind)
        if (behind > depth[p]) depth[p] = behind
      }
      // Σ of the per-thread shares. Below 0 only when more was settled than dispatched by threads
      // that raced past their own shares: it shows as 0 and the surface repairs it with a fault.
      const inFlightSum = this.#sum(group.slot + G_IN_FLIGHT)
      if (inFlightSum < 0) this.underflows.push(group)
      const inFlight = unboxed(Math.max(0, inFlightSum))
      // dlq before dropped: a thread that runs dropped() then deadLettered() between the two
      // reads must not make a scrape show dlq > dropped. Never capped: a violation shows.
      const dlqRead = this.#count(group.slot + G_DLQ)
      const droppedRead = this.#count(group.slot + G_DROPPED)
      const snapshot = groupSnapshot(
        group,
        this.#count(group.slot + G_DELIVERED),
        droppedRead,
        dlqRead,
        this.#count(group.slot + G_RETRIES),
        inFlight,
        unboxed(lag),
        typeof groupDepth === 'number' ? unboxed(groupDepth) : groupDepth,
        ackFloors ? (groupFloors as number[]) : undefined,
        startOf(this.#sharedOf(group.slot >>> Chunk.Shift), group.slot & Chunk.Mask),
        windows.length !== 0 && windows.length >= partitionCount,
        !floorCanLead(numbers, windows, group.floorPartitions, this.#floorMoved(group.slot)),
      )
      delivered = addCount(delivered, snapshot.delivered)
      dropped = addCount(dropped, snapshot.dropped)
      dlq = addCount(dlq, snapshot.dlq)
      groups[g] = snapshot
    }
    // Removed groups: their counts stay in the topic's (counters never go down), read from their
    // cells while a late call may still land there, then from the totals they retired into.
    const retiring = topic.retiring
    for (let g = 0; g < retiring.length; g++) {
      const slot = retiring[g].slot
      delivered = addCount(delivered, this.#count(slot + G_DELIVERED))
      dlq = addCount(dlq, this.#count(slot + G_DLQ))
      dropped = addCount(dropped, this.#count(slot + G_DROPPED))
    }
    if (topic.retiredDelivered !== 0 || topic.retiredDropped !== 0 || topic.retiredDlq !== 0) {
      delivered = addCount(delivered, topic.retiredDelivered)
      dropped = addCount(dropped, topic.retiredDropped)
      dlq = addCount(dlq, topic.retiredDlq)
    }
    SnapshotReader.parkAt?.('counters', topic.name)
    // The topic's counters before its producers' markers: a producer sets its marker, then writes
    // its counter, then last_seq (topic.ts). A counter read after the marker check could be one
    // whose producer started after that check, its last_seq not written yet; were the producer to
    // finish after the re-read's last_seq read but before the re-read's marker check, both reads
    // would show the same torn numbers, unmarked. Read before the check, a counter ahead of
    // last_seq is one whose marker is still set at the check, or whose last_seq the re-read sees.
    const produced = this.#count(topic.slot)
    const bytes = this.#count(topic.slot + 1)
    // Both, always: the locks are looked at (a dead holder's taken over, a pending move finished)
    // whatever a producer's marker says.
    const held = this.#locksHeld(topic, pending, only)
    const writing = this.#sum(topic.slot + 2) !== 0 || held
    const left = (this.#shared[topic.slot >>> Chunk.Shift] ?? this.#sharedOf(topic.slot >>> Chunk.Shift))[(topic.slot & Chunk.Mask) + T_GROUP_LEFT]
    return topicSnapshot(topic, produced, bytes, delivered, dropped, dlq, lastSeq, depth, groups, writing, leftLately(left, this.#now))
  }
}

// Numbers in snapshot objects, unboxed. Sums of Float64Array cells are doubles, and V8 stored
// each in a heap number of its own: ~74,000 per 187k-sample read (1.2 MB of garbage). An integer
// below 2^31 converted to int32 is stored as a small integer instead, in place — provided the
// field's representation is Tagged, not Double: V8 gives a field the representation of the first
// values stored in it, so one first object with bigint counters (a Count may be one) settles that.

/**
 * Whether a partition of `numbers` without a window of the group has a floor of it that ackFloor()
 * has moved (a floor block, and its class's bit in `moved`, entities.ts G_FLOOR_MOVED_INT32): only
 * such a floor can lead the group's counts. A group that moved floors with ackFloor() and then
 * settles those partitions per message is held to in_flight ≤ depth again, whatever floors it
 * started at (`from`) or expire() moved on others. The three arrays ascending. A floor
 * registered by another thread and not known here yet is read as not moved (depth not lowered by
 * it), so it cannot make a false excess.
 */
function floorCanLead(numbers: readonly number[], windows: readonly number[], floors: readonly number[], moved: number): boolean {
  if (moved === 0) return false
  for (let p = 0, w = 0, f = 0; p < numbers.length; p++) {
    const n = numbers[p]
    while (w < windows.length && windows[w] < n) w++
    if (w < windows.length && windows[w] === n) continue
    while (f < floors.length && floors[f] < n) f++
    if (f < floors.length && floors[f] === n && (moved & floorMovedBit(n)) !== 0) return true
  }
  return false
}

/** `value` as an int32 when it is one exactly (stored unboxed), else unchanged. */
function unboxed(value: number): number {
  return (value | 0) === value ? value | 0 : value
}

function groupSnapshot(
  group: GroupEntity, delivered: Count, dropped: Count, dlq: Count, retries: Count,
  inFlight: number, lag: number, depth: Count, ackFloors: readonly number[] | undefined, start: Count,
  settledPerMessage: boolean,
  floorsFollowCounts: boolean,
): GroupSnapshot {
  return {
    name: group.name,
    label: group.label,
    delivered,
    dropped,
    dlq,
    retries,
    inFlight,
    maxInFlight: group.maxInFlight,
    lag,
    depth,
    ackFloors,
    settledPerMessage,
    inFlightBounded: settledPerMessage || floorsFollowCounts,
    start,
    key: group,
  }
}

function topicSnapshot(
  topic: TopicEntity, produced: Count, bytes: Count, delivered: Count, dropped: Count, dlq: Count,
  lastSeq: readonly number[], depth: readonly number[], groups: GroupSnapshot[], producing: boolean, groupLeft: boolean,
): TopicSnapshot {
  return {
    name: topic.name,
    label: topic.label,
    produced,
    bytes,
    producing,
    delivered,
    dropped,
    dlq,
    partitionNumbers: topic.partitionNumbers,
    lastSeq,
    depth,
    groups,
    key: topic,
    groupLeft,
  }
}

{
  const tagged = 2n ** 64n as unknown as number
  const entity = new TopicEntity(0, '', '', 0)
  const group = new GroupEntity(entity, 0, '', '', 0, 0, 0)
  topicSnapshot(entity, tagged, tagged, tagged, tagged, tagged, [], [], [groupSnapshot(group, tagged, tagged, tagged, tagged, tagged, tagged, tagged, [], 0, false, false)], false, false)
}

/** A group's balance at registration (entities.ts G_START): a bigint past 2^53 − 1, as the counters. */
function startOf(shared: Float64Array, at: number): Count {
  const low = shared[at + G_START]
  const high = shared[at + G_START_HIGH]
  if (high === 0) return low
  const value = high * 2 ** 32 + low
  return value <= MAX_SAFE ? value : BigInt(high) * 2n ** 32n + BigInt(low)
}

function byLabelThenName(a: { label: string; name: string }, b: { label: string; name: string }): number {
  if (a.label !== b.label) return a.label < b.label ? -1 : 1
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0
}
