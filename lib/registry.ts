// Names → slots, shared by every thread of the process.
//
// Registration is rare and goes through an append-only log in shared memory, written under the
// lock: every thread replays the same entries in the same order, so each holds an identical
// local picture (names, slot bases, free lists) without any message passing — a topic first
// seen in a worker is in the main thread's next snapshot because the snapshot replays the log
// first. Recording never touches the log (see recording.ts).
import { ResolvedConfig } from './config'
import { ClosedError, RemovedTopicError } from './errors'
import { sanitizeLabelValue } from './labels'
import {
  C_CLOSED, C_LOG_END, C_NEXT_CHUNK, C_NEXT_ID, C_NEXT_SLOT, C_WORKER_FAULTS, LOG_CHUNK_INTS, Memory, SHARED_ROW, SLOTS_PER_CHUNK,
} from './memory'

// Slot block sizes. Thread rows use the counter cells; the shared row uses the rest.
export const TOPIC_SLOTS = 3 // rows: produced, bytes, writing marker · shared: liveness tag (the topic id)
export const PARTITION_SLOTS = 1 // rows: last_seq · shared: last_seq hint (max seen by any thread)
export const GROUP_SLOTS = 6 // rows: delivered, dropped, dlq, retries, in_flight share · shared: +5 dispatch lock (Int32)
export const FLOOR_SLOTS = 1 // rows: ack_floor · shared: ack_floor hint
export const G_DELIVERED = 0
export const G_DROPPED = 1
export const G_DLQ = 2
export const G_RETRIES = 3
/** This thread's share of in_flight: dispatched here − settled here (may be < 0, see recording.ts). */
export const G_IN_FLIGHT = 4
export const G_LOCK = 5

// Log entries: one header int (type | length << 4, length in ints, header included), then the
// fields. Kept small: the log lives as long as the surface, and at 4,348 topics × 16 partitions ×
// 2 groups its partition and floor entries are most of it (a separate length int and a `reused`
// flag made it 30 B per sample; now 21). Whether a block is reused needs no flag: a reused block
// is the front of its size's free queue (every thread holds the same queue), a fresh one never is.
const E_SKIP = 1 // rest of this log chunk is unused
const E_TOPIC = 2 // topicId, slot, nameLength, name…
const E_REMOVE = 3 // topicId, fence… (Memory.fence: when the freed blocks may be reused)
const E_PARTITION = 4 // topicId, partition, slot
const E_GROUP = 5 // topicId, groupId, slot, maxInFlight, nameLength, name…
const E_FLOOR = 6 // groupId, partition, slot
const E_FOLD = 7 // slot, high 32 bits, low 32 bits of the amount moved out of a row
const E_FAULT = 8 // jsonLength, json… (a fault raised in a worker, for the main thread)
const HEADER = 1 // type | length << TYPE_BITS
const TYPE_BITS = 4
const TYPE_MASK = (1 << TYPE_BITS) - 1

/** Faults a worker may queue for the main thread; past this only the counts go up. */
export const MAX_WORKER_FAULT_ENTRIES = 10_000

/** A removal's fence (Memory.fence), shared by the blocks it freed; `passed` once known. */
interface Fence {
  readonly fields: number[]
  passed: boolean
  checkedAt: number
}

/** Freed blocks of one size, oldest first: `slots[head…]`, each with its removal's fence. */
interface FreeQueue {
  slots: number[]
  fences: Fence[]
  head: number
}

/** How often an allocation may ask /proc whether a fence has passed (else it takes a fresh block). */
const FENCE_CHECK_MS = 5

/** Shared by every entity that has none yet (never mutated). */
const NONE: readonly number[] = Object.freeze([])

// Partitions and ack floors are sorted arrays, not Maps: partition numbers are usually dense small
// integers, and at 4,348 topics × 16 partitions × 2 groups the Maps and one PartitionEntity per
// partition cost ~70 B per sample. The arrays are replaced on change, never mutated in place, so
// a snapshot can share them (registration is rare; a copy per registration is cheap).

export class GroupEntity {
  /**
   * Partitions this group has an ack floor on, ascending, and the slot of each floor (parallel).
   * Replaced, never mutated. While the group has a floor on every partition of its topic,
   * `floorPartitions` is the topic's own `partitionNumbers` array (one copy, and the reader can
   * index both alike).
   */
  floorPartitions: readonly number[] = NONE
  floorSlots: readonly number[] = NONE
  constructor(
    readonly topic: TopicEntity,
    readonly id: number,
    readonly name: string,
    readonly label: string,
    readonly slot: number,
    readonly maxInFlight: number,
  ) {}

  /** The slot of this group's ack floor on `partition`, or undefined before it has one. */
  floorSlot(partition: number): number | undefined {
    const at = indexOf(this.floorPartitions, partition)
    return at < 0 ? undefined : this.floorSlots[at]
  }
}

export class TopicEntity {
  alive = true
  /** Ascending partition numbers and the slot of each one's last_seq (parallel). Replaced, never mutated. */
  partitionNumbers: readonly number[] = NONE
  partitionSlots: readonly number[] = NONE
  /** Ascending by label, then by raw name (JS string order). Replaced, never mutated. */
  groups: readonly GroupEntity[] = []
  constructor(readonly id: number, readonly name: string, readonly label: string, readonly slot: number) {}

  /** The slot of `partition`'s last_seq, or undefined before the partition is seen. */
  partitionSlot(partition: number): number | undefined {
    const at = indexOf(this.partitionNumbers, partition)
    return at < 0 ? undefined : this.partitionSlots[at]
  }

  /** The group registered under this raw name (linear: a handful per topic, looked up on registration only). */
  group(name: string): GroupEntity | undefined {
    for (let g = 0; g < this.groups.length; g++) if (this.groups[g].name === name) return this.groups[g]
    return undefined
  }
}

/** Index of `partition` in an ascending array, or −1. Dense partitions 0…n−1 sit at their own index. */
function indexOf(numbers: readonly number[], partition: number): number {
  if (partition < numbers.length && numbers[partition] === partition) return partition
  let low = 0
  let high = numbers.length - 1
  while (low <= high) {
    const middle = (low + high) >>> 1
    const value = numbers[middle]
    if (value === partition) return middle
    if (value < partition) low = middle + 1
    else high = middle - 1
  }
  return -1
}

/** Copies of `numbers` and `values` with (`partition`, `value`) inserted in order, sized exactly. */
function inserted(numbers: readonly number[], values: readonly number[], partition: number, value: number): [number[], number[]] {
  const length = numbers.length + 1
  const newNumbers: number[] = new Array(length)
  const newValues: number[] = new Array(length)
  let from = 0
  for (let to = 0; to < length; to++) {
    if (from === to && (from === numbers.length || numbers[from] > partition)) {
      newNumbers[to] = partition
      newValues[to] = value
    } else {
      newNumbers[to] = numbers[from]
      newValues[to] = values[from++]
    }
  }
  return [newNumbers, newValues]
}

function sameNumbers(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false
  return true
}

/** A copy of `groups` with `group` in its place (ascending by label, then raw name), sized exactly. */
function withGroup(groups: readonly GroupEntity[], group: GroupEntity): GroupEntity[] {
  const out: GroupEntity[] = new Array(groups.length + 1)
  let at = groups.length
  while (at > 0 && byLabelThenName(groups[at - 1], group) > 0) at--
  for (let g = 0; g < at; g++) out[g] = groups[g]
  out[at] = group
  for (let g = at; g < groups.length; g++) out[g + 1] = groups[g]
  return out
}

function byLabelThenName(a: GroupEntity, b: GroupEntity): number {
  if (a.label !== b.label) return a.label < b.label ? -1 : 1
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0
}

export interface FaultRecord {
  code: string
  metric: string
  labels: Record<string, string>
  previous: number | null
  attempted: number | null
  at: string
}

export class Registry {
  readonly memory: Memory
  readonly config: ResolvedConfig
  readonly topics = new Map<string, TopicEntity>() // live topics by raw name
  readonly #topicsById = new Map<number, TopicEntity>()
  readonly #groupsById = new Map<number, GroupEntity>()
  readonly #free = new Map<number, FreeQueue>() // block size → freed blocks, oldest first
  /** slot → amount moved out of a row when it neared 2^53 (SPEC §2: 64-bit counters). */
  readonly folds = new Map<number, bigint>()
  /** Faults that workers raised, not yet taken by the main thread. */
  readonly workerFaults: FaultRecord[] = []
  #cursor = 0
  /** The name in the entry this thread is appending (applied from the string it has, not re-read: one copy). */
  #appending: { position: number; text: string } | undefined
  /** Bumped by every applied entry that changes the set of series. */
  generation = 0
  /**
   * Told when this thread replays a removal (whichever thread removed it), so that the thread's
   * recorder drops its handle: a worker that met many topics the main thread later removed would
   * otherwise keep one dead handle each (soak: ~1 KB per topic, 50 MB after 50,000).
   */
  onTopicRemoved: ((topic: TopicEntity) => void) | undefined

  constructor(memory: Memory, config: ResolvedConfig) {
    this.memory = memory
    this.config = config
  }

  /** Replays log entries other threads appended since the last call. */
  sync(): void {
    const end = Atomics.load(this.memory.control, C_LOG_END)
    while (this.#cursor < end) this.#applyAt(this.#cursor)
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
        throw new RangeError(`cannot register topic ${JSON.stringify(name)}: max_topics (${this.config.max_topics}) reached`)
      }
      const id = this.#nextId()
      const slot = this.#allocate(TOPIC_SLOTS)
      // The liveness tag must be set before the entry is published (handles compare it to the id).
      this.#sharedF64(slot)[slot % SLOTS_PER_CHUNK] = id
      this.#append(E_TOPIC, [id, slot], name)
      return this.#topicsById.get(id)!
    })
  }

  /**
   * The surface closed: from now on every handle, in every thread, throws ClosedError on its next
   * call (each live topic's liveness tag is cleared, the check every recording call makes
   * already), and nothing registers any more (#locked). Idempotent.
   */
  close(): void {
    this.memory.lock()
    try {
      this.sync()
      this.memory.control[C_CLOSED] = 1
      for (const topic of this.topics.values()) this.#sharedF64(topic.slot)[topic.slot % SLOTS_PER_CHUNK] = 0
    } finally {
      this.memory.unlock()
    }
  }

  /** The surface was closed (by any thread's view of the shared control block). */
  get closed(): boolean {
    return this.memory.control[C_CLOSED] === 1
  }

  removeTopic(name: string): boolean {
    return this.#locked(() => {
      const topic = this.topics.get(name)
      if (!topic) return false
      this.#sharedF64(topic.slot)[topic.slot % SLOTS_PER_CHUNK] = 0
      this.#append(E_REMOVE, [topic.id, ...this.memory.fence()])
      return true
    })
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
        throw new RangeError(`cannot register partition ${partition} of topic ${JSON.stringify(topic.name)}: max_partitions_per_topic (${this.config.max_partitions_per_topic}) reached`)
      }
      const slot = this.#allocate(PARTITION_SLOTS)
      this.#append(E_PARTITION, [topic.id, partition, slot])
      return topic.partitionSlot(partition)!
    })
  }

  group(topic: TopicEntity, name: string, maxInFlight: number): GroupEntity {
    const known = topic.group(name)
    if (known) return known
    return this.#locked(() => {
      this.#assertAlive(topic)
      const again = topic.group(name)
      if (again) return again
      if (topic.groups.length >= this.config.max_groups_per_topic) {
        throw new RangeError(`cannot register group ${JSON.stringify(name)} on topic ${JSON.stringify(topic.name)}: max_groups_per_topic (${this.config.max_groups_per_topic}) reached`)
      }
      const id = this.#nextId()
      const slot = this.#allocate(GROUP_SLOTS)
      this.#append(E_GROUP, [topic.id, id, slot, maxInFlight], name)
      return this.#groupsById.get(id)!
    })
  }

  floor(group: GroupEntity, partition: number): number {
    const known = group.floorSlot(partition)
    if (known !== undefined) return known
    return this.#locked(() => {
      this.#assertAlive(group.topic)
      const again = group.floorSlot(partition)
      if (again !== undefined) return again
      const slot = this.#allocate(FLOOR_SLOTS)
      this.#append(E_FLOOR, [group.id, partition, slot])
      return group.floorSlot(partition)!
    })
  }

  /** Moves `amount` out of a row cell into the log, exactly (the cell neared 2^53). */
  fold(row: Float64Array, index: number, slot: number, amount: number, topic: TopicEntity): void {
    this.#locked(() => {
      this.#assertAlive(topic) // removed while this thread waited for the lock: its slots are not its own
      row[index] -= amount
      this.#append(E_FOLD, [slot, Math.floor(amount / 2 ** 32), amount % 2 ** 32])
    })
  }

  /** A worker's fault, queued in the log for the main thread (bounded). */
  queueFault(fault: FaultRecord): boolean {
    if (Atomics.add(this.memory.control, C_WORKER_FAULTS, 1) >= MAX_WORKER_FAULT_ENTRIES) return false
    this.#locked(() => this.#append(E_FAULT, [], JSON.stringify(fault).slice(0, 4000)))
    return true
  }

  #assertAlive(topic: TopicEntity): void {
    // The handle's own liveness check passed, then the removal landed before the lock: the same
    // error as if it had landed first (a broker that catches RemovedTopicError re-resolves).
    if (!topic.alive) throw new RemovedTopicError(topic.name)
  }

  #locked<T>(fn: () => T): T {
    this.memory.lock()
    try {
      this.sync()
      if (this.memory.control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
      return fn()
    } finally {
      this.memory.unlock()
    }
  }

  #nextId(): number {
    const control = this.memory.control
    const id = control[C_NEXT_ID]
    control[C_NEXT_ID] = id + 1
    return id
  }

  /** The topic's shared liveness tag still names it: not removed by any thread (SPEC §12). */
  isLive(topic: TopicEntity): boolean {
    return topic.alive && this.#sharedF64(topic.slot)[topic.slot % SLOTS_PER_CHUNK] === topic.id
  }

  #sharedF64(slot: number): Float64Array {
    return this.memory.rowChunk(SHARED_ROW, Math.floor(slot / SLOTS_PER_CHUNK), true)!
  }

  /**
   * A block of `size` slots: the oldest freed one (zeroed in every row) once no thread can still
   * write into it (its removal's fence has passed), else a fresh one. Caller locks.
   */
  #allocate(size: number): number {
    const free = this.#free.get(size)
    if (free !== undefined && free.head < free.slots.length && this.#reusable(free.fences[free.head])) {
      const slot = free.slots[free.head]
      const c = Math.floor(slot / SLOTS_PER_CHUNK)
      const at = slot % SLOTS_PER_CHUNK
      for (let row = 0; row < this.memory.rowCount(); row++) {
        this.memory.rowChunk(row, c, false)?.fill(0, at, at + size)
      }
      return slot
    }
    const control = this.memory.control
    let slot = control[C_NEXT_SLOT]
    // A block never straddles two chunks: a handle keeps one view per block.
    if ((slot % SLOTS_PER_CHUNK) + size > SLOTS_PER_CHUNK) slot = (Math.floor(slot / SLOTS_PER_CHUNK) + 1) * SLOTS_PER_CHUNK
    control[C_NEXT_SLOT] = slot + size
    return slot
  }

  /** Appends one entry, publishes it with a single store, and applies it locally. Caller locks. */
  #append(type: number, fields: number[], text?: string): void {
    const textInts = text === undefined ? 0 : 1 + Math.ceil(text.length / 2)
    const length = HEADER + fields.length + textInts
    const control = this.memory.control
    let position = control[C_LOG_END]
    let within = position % LOG_CHUNK_INTS
    if (within + length > LOG_CHUNK_INTS) {
      this.memory.logChunk(Math.floor(position / LOG_CHUNK_INTS), true)![within] = E_SKIP
      position += LOG_CHUNK_INTS - within
      within = 0
    }
    const log = this.memory.logChunk(Math.floor(position / LOG_CHUNK_INTS), true)!
    log[within] = type | (length << TYPE_BITS)
    for (let i = 0; i < fields.length; i++) log[within + HEADER + i] = fields[i]
    if (text !== undefined) {
      let at = within + HEADER + fields.length
      log[at++] = text.length
      for (let i = 0; i < text.length; i += 2) {
        log[at++] = text.charCodeAt(i) | ((i + 1 < text.length ? text.charCodeAt(i + 1) : 0) << 16)
      }
    }
    Atomics.store(control, C_LOG_END, position + length)
    this.#appending = text === undefined ? undefined : { position, text }
    try {
      while (this.#cursor < position + length) this.#applyAt(this.#cursor)
    } finally {
      this.#appending = undefined
    }
  }

  #applyAt(position: number): void {
    const within = position % LOG_CHUNK_INTS
    const log = this.memory.logChunk(Math.floor(position / LOG_CHUNK_INTS), false)!
    const type = log[within] & TYPE_MASK
    if (type === E_SKIP) {
      this.#cursor = position + (LOG_CHUNK_INTS - within)
      return
    }
    const length = log[within] >>> TYPE_BITS
    const f = within + HEADER
    this.#cursor = position + length
    switch (type) {
      case E_TOPIC: {
        const name = this.#textAt(position, log, f + 2)
        this.#take(TOPIC_SLOTS, log[f + 1])
        const topic = new TopicEntity(log[f], name, sanitizeLabelValue(name), log[f + 1])
        this.topics.set(name, topic)
        this.#topicsById.set(topic.id, topic)
        break
      }
      case E_REMOVE: {
        const topic = this.#topicsById.get(log[f])!
        topic.alive = false
        this.topics.delete(topic.name)
        this.#topicsById.delete(topic.id)
        // Every thread replays the same entries into the same arrays, so it queues the same
        // blocks in the same order. They wait for the removal's fence (Memory.fence).
        const fence: Fence = { fields: Array.from(log.subarray(f + 1, within + length)), passed: false, checkedAt: 0 }
        for (const slot of topic.partitionSlots) this.#release(PARTITION_SLOTS, slot, fence)
        for (const group of topic.groups) {
          for (const slot of group.floorSlots) this.#release(FLOOR_SLOTS, slot, fence)
          this.#release(GROUP_SLOTS, group.slot, fence)
          this.#groupsById.delete(group.id)
        }
        this.#release(TOPIC_SLOTS, topic.slot, fence)
        this.onTopicRemoved?.(topic)
        break
      }
      case E_PARTITION: {
        const topic = this.#topicsById.get(log[f])!
        this.#take(PARTITION_SLOTS, log[f + 2])
        ;[topic.partitionNumbers, topic.partitionSlots] = inserted(topic.partitionNumbers, topic.partitionSlots, log[f + 1], log[f + 2])
        break
      }
      case E_GROUP: {
        const topic = this.#topicsById.get(log[f])!
        const name = this.#textAt(position, log, f + 4)
        this.#take(GROUP_SLOTS, log[f + 2])
        const group = new GroupEntity(topic, log[f + 1], name, sanitizeLabelValue(name), log[f + 2], log[f + 3])
        topic.groups = withGroup(topic.groups, group)
        this.#groupsById.set(group.id, group)
        break
      }
      case E_FLOOR: {
        const group = this.#groupsById.get(log[f])!
        this.#take(FLOOR_SLOTS, log[f + 2])
        const [partitions, slots] = inserted(group.floorPartitions, group.floorSlots, log[f + 1], log[f + 2])
        const all = group.topic.partitionNumbers
        group.floorPartitions = sameNumbers(partitions, all) ? all : partitions
        group.floorSlots = slots
        break
      }
      case E_FOLD: {
        const slot = log[f]
        const amount = BigInt(log[f + 1]) * 2n ** 32n + BigInt(log[f + 2] >>> 0)
        this.folds.set(slot, (this.folds.get(slot) ?? 0n) + amount)
        break
      }
      case E_FAULT:
        try {
          this.workerFaults.push(JSON.parse(readText(log, f)) as FaultRecord)
        } catch {
          // A fault text cut at the 4,000-character bound is not valid JSON; its count was kept.
        }
        break
      default:
        throw new Error(`mq-metrics: corrupt registration log entry ${type} at ${position}`)
    }
    if (type !== E_FAULT && type !== E_FOLD) this.generation++
  }

  #textAt(position: number, log: Int32Array, at: number): string {
    const appending = this.#appending
    return appending !== undefined && appending.position === position ? appending.text : readText(log, at)
  }

  /** Whether a removal's fence has passed (asked of /proc at most every FENCE_CHECK_MS). */
  #reusable(fence: Fence): boolean {
    if (fence.passed) return true
    const now = Date.now()
    if (now - fence.checkedAt < FENCE_CHECK_MS) return false
    fence.checkedAt = now
    fence.passed = this.memory.fencePassed(fence.fields)
    return fence.passed
  }

  /** A block is in use again: drop it from the free queue and forget its old folds. */
  #take(size: number, slot: number): void {
    // #allocate reuses the front of the queue; a fresh block is above every block ever freed.
    const free = this.#free.get(size)
    if (free !== undefined && free.head < free.slots.length && free.slots[free.head] === slot) {
      free.head++
      if (free.head >= 1024 && free.head * 2 >= free.slots.length) {
        free.slots.splice(0, free.head)
        free.fences.splice(0, free.head)
        free.head = 0
      }
    }
    for (let i = 0; i < size; i++) this.folds.delete(slot + i)
  }

  #release(size: number, slot: number, fence: Fence): void {
    let free = this.#free.get(size)
    if (!free) this.#free.set(size, (free = { slots: [], fences: [], head: 0 }))
    free.slots.push(slot)
    free.fences.push(fence)
  }

  /** Slots handed out and not freed (for the soak test's leak check). */
  slotsInUse(): number {
    let freed = 0
    for (const [size, queue] of this.#free) freed += size * (queue.slots.length - queue.head)
    return this.memory.control[C_NEXT_SLOT] - freed
  }

  /**
   * Memory the registry holds in the arena, for leak checks: slots ever handed out (freed blocks
   * are reused, so this stops growing once churn reaches a steady state), arena chunks allocated,
   * the registration log's length in bytes (append-only: every registration and removal adds
   * to it for the life of the surface), and thread rows claimed (the main thread's included;
   * rows of exited threads are reused, so this counts threads alive at once, not attaches).
   */
  arenaUsage(): { slotsInUse: number; slotsReserved: number; chunks: number; logBytes: number; threadRows: number } {
    const control = this.memory.control
    return {
      threadRows: this.memory.rowCount() - 1, // row 0 is the shared row, not a thread
      slotsInUse: this.slotsInUse(),
      slotsReserved: control[C_NEXT_SLOT],
      chunks: Atomics.load(control, C_NEXT_CHUNK),
      logBytes: Atomics.load(control, C_LOG_END) * 4,
    }
  }
}

function readText(log: Int32Array, at: number): string {
  const length = log[at]
  let text = ''
  for (let i = 0; i < length; i += 2) {
    const pair = log[at + 1 + i / 2]
    text += String.fromCharCode(pair & 0xffff)
    if (i + 1 < length) text += String.fromCharCode(pair >>> 16)
  }
  return text
}
