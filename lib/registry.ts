// Names → slots, shared by every thread of the process.
//
// Registration is rare and goes through an append-only log in shared memory, written under the
// lock: every thread replays the same entries in the same order, so each holds an identical
// local picture (names, slot bases, free lists) without any message passing — a topic first
// seen in a worker is in the main thread's next snapshot because the snapshot replays the log
// first. Recording never touches the log (see recording.ts).
import { ResolvedConfig } from './config'
import { sanitizeLabelValue } from './labels'
import {
  C_LOG_END, C_NEXT_ID, C_NEXT_SLOT, C_WORKER_FAULTS, LOG_CHUNK_INTS, Memory, SHARED_ROW, SLOTS_PER_CHUNK,
} from './memory'

// Slot block sizes. Thread rows use the counter cells; the shared row uses the rest.
export const TOPIC_SLOTS = 2 // rows: produced, bytes · shared: liveness tag (the topic id)
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

const E_SKIP = 1 // rest of this log chunk is unused
const E_TOPIC = 2 // topicId, slot, reused, nameLength, name…
const E_REMOVE = 3 // topicId
const E_PARTITION = 4 // topicId, partition, slot, reused
const E_GROUP = 5 // topicId, groupId, slot, reused, maxInFlight, nameLength, name…
const E_FLOOR = 6 // groupId, partition, slot, reused
const E_FOLD = 7 // slot, high 32 bits, low 32 bits of the amount moved out of a row
const E_FAULT = 8 // jsonLength, json… (a fault raised in a worker, for the main thread)
const HEADER = 2 // type, length

/** Faults a worker may queue for the main thread; past this only the counts go up. */
export const MAX_WORKER_FAULT_ENTRIES = 10_000

export class PartitionEntity {
  constructor(readonly topic: TopicEntity, readonly partition: number, readonly slot: number) {}
}

export class GroupEntity {
  /** partition → slot of this group's ack floor on it. */
  readonly floors = new Map<number, number>()
  constructor(
    readonly topic: TopicEntity,
    readonly id: number,
    readonly name: string,
    readonly label: string,
    readonly slot: number,
    readonly maxInFlight: number,
  ) {}
}

export class TopicEntity {
  alive = true
  readonly partitions = new Map<number, PartitionEntity>()
  readonly groups = new Map<string, GroupEntity>()
  constructor(readonly id: number, readonly name: string, readonly label: string, readonly slot: number) {}
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
  readonly #free = new Map<number, number[]>() // block size → freed slot bases (stack)
  /** slot → amount moved out of a row when it neared 2^53 (SPEC §2: 64-bit counters). */
  readonly folds = new Map<number, bigint>()
  /** Faults that workers raised, not yet taken by the main thread. */
  readonly workerFaults: FaultRecord[] = []
  #cursor = 0
  /** Bumped by every applied entry that changes the set of series. */
  generation = 0

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
    if (known) return known
    return this.#locked(() => {
      const again = this.topics.get(name)
      if (again) return again
      if (this.topics.size >= this.config.max_topics) {
        throw new RangeError(`cannot register topic ${JSON.stringify(name)}: max_topics (${this.config.max_topics}) reached`)
      }
      const id = this.#nextId()
      const [slot, reused] = this.#allocate(TOPIC_SLOTS)
      // The liveness tag must be set before the entry is published (handles compare it to the id).
      this.#sharedF64(slot)[slot % SLOTS_PER_CHUNK] = id
      this.#append(E_TOPIC, [id, slot, reused], name)
      return this.#topicsById.get(id)!
    })
  }

  removeTopic(name: string): boolean {
    return this.#locked(() => {
      const topic = this.topics.get(name)
      if (!topic) return false
      this.#sharedF64(topic.slot)[topic.slot % SLOTS_PER_CHUNK] = 0
      this.#append(E_REMOVE, [topic.id])
      return true
    })
  }

  partition(topic: TopicEntity, partition: number): PartitionEntity {
    const known = topic.partitions.get(partition)
    if (known) return known
    return this.#locked(() => {
      this.#assertAlive(topic)
      const again = topic.partitions.get(partition)
      if (again) return again
      if (topic.partitions.size >= this.config.max_partitions_per_topic) {
        throw new RangeError(`cannot register partition ${partition} of topic ${JSON.stringify(topic.name)}: max_partitions_per_topic (${this.config.max_partitions_per_topic}) reached`)
      }
      const [slot, reused] = this.#allocate(PARTITION_SLOTS)
      this.#append(E_PARTITION, [topic.id, partition, slot, reused])
      return topic.partitions.get(partition)!
    })
  }

  group(topic: TopicEntity, name: string, maxInFlight: number): GroupEntity {
    const known = topic.groups.get(name)
    if (known) return known
    return this.#locked(() => {
      this.#assertAlive(topic)
      const again = topic.groups.get(name)
      if (again) return again
      if (topic.groups.size >= this.config.max_groups_per_topic) {
        throw new RangeError(`cannot register group ${JSON.stringify(name)} on topic ${JSON.stringify(topic.name)}: max_groups_per_topic (${this.config.max_groups_per_topic}) reached`)
      }
      const id = this.#nextId()
      const [slot, reused] = this.#allocate(GROUP_SLOTS)
      this.#append(E_GROUP, [topic.id, id, slot, reused, maxInFlight], name)
      return this.#groupsById.get(id)!
    })
  }

  floor(group: GroupEntity, partition: number): number {
    const known = group.floors.get(partition)
    if (known !== undefined) return known
    return this.#locked(() => {
      this.#assertAlive(group.topic)
      const again = group.floors.get(partition)
      if (again !== undefined) return again
      const [slot, reused] = this.#allocate(FLOOR_SLOTS)
      this.#append(E_FLOOR, [group.id, partition, slot, reused])
      return group.floors.get(partition)!
    })
  }

  /** Moves `amount` out of a row cell into the log, exactly (the cell neared 2^53). */
  fold(row: Float64Array, index: number, slot: number, amount: number): void {
    this.#locked(() => {
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
    if (!topic.alive) throw new Error(`topic ${JSON.stringify(topic.name)} was removed`)
  }

  #locked<T>(fn: () => T): T {
    this.memory.lock()
    try {
      this.sync()
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

  #sharedF64(slot: number): Float64Array {
    return this.memory.rowChunk(SHARED_ROW, Math.floor(slot / SLOTS_PER_CHUNK), true)!
  }

  /** A block of `size` slots: a freed one (zeroed in every row) or a fresh one. Caller locks. */
  #allocate(size: number): [number, number] {
    const free = this.#free.get(size)
    if (free && free.length > 0) {
      const slot = free[free.length - 1]
      const c = Math.floor(slot / SLOTS_PER_CHUNK)
      const at = slot % SLOTS_PER_CHUNK
      for (let row = 0; row < this.memory.rowCount(); row++) {
        this.memory.rowChunk(row, c, false)?.fill(0, at, at + size)
      }
      return [slot, 1]
    }
    const control = this.memory.control
    let slot = control[C_NEXT_SLOT]
    // A block never straddles two chunks: a handle keeps one view per block.
    if ((slot % SLOTS_PER_CHUNK) + size > SLOTS_PER_CHUNK) slot = (Math.floor(slot / SLOTS_PER_CHUNK) + 1) * SLOTS_PER_CHUNK
    control[C_NEXT_SLOT] = slot + size
    return [slot, 0]
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
    log[within] = type
    log[within + 1] = length
    for (let i = 0; i < fields.length; i++) log[within + HEADER + i] = fields[i]
    if (text !== undefined) {
      let at = within + HEADER + fields.length
      log[at++] = text.length
      for (let i = 0; i < text.length; i += 2) {
        log[at++] = text.charCodeAt(i) | ((i + 1 < text.length ? text.charCodeAt(i + 1) : 0) << 16)
      }
    }
    Atomics.store(control, C_LOG_END, position + length)
    while (this.#cursor < position + length) this.#applyAt(this.#cursor)
  }

  #applyAt(position: number): void {
    const within = position % LOG_CHUNK_INTS
    const log = this.memory.logChunk(Math.floor(position / LOG_CHUNK_INTS), false)!
    const type = log[within]
    if (type === E_SKIP) {
      this.#cursor = position + (LOG_CHUNK_INTS - within)
      return
    }
    const length = log[within + 1]
    const f = within + HEADER
    this.#cursor = position + length
    switch (type) {
      case E_TOPIC: {
        const name = readText(log, f + 3)
        this.#take(TOPIC_SLOTS, log[f + 1], log[f + 2])
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
        // Free in insertion order: every thread pushes the same blocks in the same order.
        for (const partition of topic.partitions.values()) this.#release(PARTITION_SLOTS, partition.slot)
        for (const group of topic.groups.values()) {
          for (const slot of group.floors.values()) this.#release(FLOOR_SLOTS, slot)
          this.#release(GROUP_SLOTS, group.slot)
          this.#groupsById.delete(group.id)
        }
        this.#release(TOPIC_SLOTS, topic.slot)
        break
      }
      case E_PARTITION: {
        const topic = this.#topicsById.get(log[f])!
        this.#take(PARTITION_SLOTS, log[f + 2], log[f + 3])
        topic.partitions.set(log[f + 1], new PartitionEntity(topic, log[f + 1], log[f + 2]))
        break
      }
      case E_GROUP: {
        const topic = this.#topicsById.get(log[f])!
        const name = readText(log, f + 5)
        this.#take(GROUP_SLOTS, log[f + 2], log[f + 3])
        const group = new GroupEntity(topic, log[f + 1], name, sanitizeLabelValue(name), log[f + 2], log[f + 4])
        topic.groups.set(name, group)
        this.#groupsById.set(group.id, group)
        break
      }
      case E_FLOOR: {
        const group = this.#groupsById.get(log[f])!
        this.#take(FLOOR_SLOTS, log[f + 2], log[f + 3])
        group.floors.set(log[f + 1], log[f + 2])
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

  /** A block is in use again: drop it from the free list and forget its old folds. */
  #take(size: number, slot: number, reused: number): void {
    if (reused) {
      const free = this.#free.get(size)!
      free.splice(free.lastIndexOf(slot), 1)
    }
    for (let i = 0; i < size; i++) this.folds.delete(slot + i)
  }

  #release(size: number, slot: number): void {
    let free = this.#free.get(size)
    if (!free) this.#free.set(size, (free = []))
    free.push(slot)
  }

  /** Slots handed out and not freed (for the soak test's leak check). */
  slotsInUse(): number {
    let freed = 0
    for (const [size, list] of this.#free) freed += size * list.length
    return this.memory.control[C_NEXT_SLOT] - freed
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
