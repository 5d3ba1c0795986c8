// The hot path: topic and group handles, resolved once, then recorded on millions of times a
// second. Each method validates its arguments, checks what SPEC §5 needs, and only then writes —
// a rejected call leaves every number as it was. Counters go to this thread's own row (a plain
// Float64Array add: no lock, no atomic, no N-API call); the few cells that need an exact bound
// across threads (in_flight, the dlq credit) use Atomics on the shared row.
import { FatalInvariantError, RemovedTopicError } from './errors'
import { describe, validateName } from './labels'
import { C_QUORUM, SHARED_ROW, SLOTS_PER_CHUNK, acquire, release } from './memory'
import { MAX_IN_FLIGHT_LIMIT } from './config'
import {
  G_DELIVERED, G_DLQ, G_DROPPED, G_IN_FLIGHT, G_LOCK, G_RETRIES, GroupEntity, Registry, TopicEntity,
} from './registry'

export type FaultSink = (code: string, metric: string, labels: Record<string, string>, previous: number | null, attempted: number | null) => void

const MAX_SAFE = Number.MAX_SAFE_INTEGER
const MAX_PARTITION = 0x7fffffff

/** SPEC §5: counter increments and sequence numbers are non-negative safe integers. */
function checkCount(what: string, value: unknown): number {
  if (typeof value !== 'number') throw new TypeError(`${what} must be a non-negative integer, got ${describe(value)}`)
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`${what} must be a non-negative integer no larger than 2^53 - 1, got ${describe(value)}`)
  }
  return value
}

function checkPartition(value: unknown): number {
  if (typeof value !== 'number') throw new TypeError(`partition must be an integer, got ${describe(value)}`)
  if (!Number.isInteger(value) || value < 0 || value > MAX_PARTITION) {
    throw new RangeError(`partition must be an integer from 0 to ${MAX_PARTITION}, got ${describe(value)}`)
  }
  return value
}

/** Per-thread context shared by every handle of one surface (or one worker's recorder). */
export class Recorder {
  readonly registry: Registry
  readonly row: number
  readonly fault: FaultSink
  readonly #topics = new Map<string, Topic>()
  readonly #control: Int32Array

  constructor(registry: Registry, row: number, fault: FaultSink) {
    this.registry = registry
    this.row = row
    this.fault = fault
    this.#control = registry.memory.control
  }

  /** SPEC §12: same name → same handle (until the topic is removed). */
  topic(name: string): Topic {
    validateName('topic name', name)
    const known = this.#topics.get(name)
    if (known !== undefined && known.entity.alive) return known
    const handle = new Topic(this, this.registry.topic(name))
    this.#topics.set(name, handle)
    return handle
  }

  forget(name: string): void {
    this.#topics.delete(name)
  }

  readOnly(): boolean {
    return this.#control[C_QUORUM] === 2
  }

  /** This thread's row cells for a block, and the block's index in them. */
  cells(slot: number): [Float64Array, number] {
    const c = Math.floor(slot / SLOTS_PER_CHUNK)
    return [this.registry.memory.rowChunk(this.row, c, true)!, slot % SLOTS_PER_CHUNK]
  }

  sharedCells(slot: number): [Float64Array, number] {
    const c = Math.floor(slot / SLOTS_PER_CHUNK)
    return [this.registry.memory.rowChunk(SHARED_ROW, c, true)!, slot % SLOTS_PER_CHUNK]
  }

  /** Adds to a row cell; past 2^53 the excess moves to the log so the total stays exact. */
  add(row: Float64Array, index: number, slot: number, n: number): void {
    const value = row[index] + n
    if (value <= MAX_SAFE) row[index] = value
    else this.registry.fold(row, index, slot, row[index]), (row[index] = n)
  }
}

class PartitionCells {
  constructor(
    readonly partition: number,
    readonly row: Float64Array, // this thread's last_seq cell
    readonly index: number,
    readonly hint: Float64Array, // shared: highest last_seq any thread wrote
  ) {}
}

export class Topic {
  readonly name: string
  readonly entity: TopicEntity
  readonly #recorder: Recorder
  readonly #row: Float64Array
  readonly #index: number
  readonly #tag: Float64Array
  readonly #slot: number
  #partitions: (PartitionCells | undefined)[] = []
  readonly #groups = new Map<string, Group>()

  constructor(recorder: Recorder, entity: TopicEntity) {
    this.name = entity.name
    this.entity = entity
    this.#recorder = recorder
    this.#slot = entity.slot
    ;[this.#row, this.#index] = recorder.cells(entity.slot)
    ;[this.#tag] = recorder.sharedCells(entity.slot)
  }

  /** Throws when the topic was removed (its slots may already belong to another topic). */
  alive(): void {
    if (this.#tag[this.#index] !== this.entity.id) throw new RemovedTopicError(this.name)
  }

  /**
   * SPEC §12: `count` messages were durably appended to `partition`; the last has `seq`.
   * Returns false (fault WRITE_WHILE_READ_ONLY, nothing changes) while the quorum is read_only.
   * Measured cost: see bench/ (target ≤ 15 ns).
   */
  produced(partition: number, seq: number, bytes: number, count = 1): boolean {
    checkCount('seq', seq)
    checkCount('bytes', bytes)
    checkCount('count', count)
    this.alive()
    const recorder = this.#recorder
    let cells = this.#partitions[partition]
    if (recorder.readOnly()) {
      // SPEC §6: in read_only the consumer-visible ceiling freezes; the write is refused and
      // changes nothing — not even a partition's first appearance.
      checkPartition(partition)
      const previous = cells === undefined ? this.lastSeqKnown(partition) : this.#lastSeq(cells)
      recorder.fault('WRITE_WHILE_READ_ONLY', 'mq_partition_last_seq', this.#labels(partition), previous, seq)
      return false
    }
    if (cells === undefined) cells = this.#resolvePartition(partition)
    const row = cells.row
    const index = cells.index
    const previous = row[index] > cells.hint[index] ? row[index] : cells.hint[index]
    if (seq < previous) {
      const labels = this.#labels(partition)
      recorder.fault('SEQ_REGRESSION', 'mq_partition_last_seq', labels, previous, seq)
      throw new FatalInvariantError('SEQ_REGRESSION', 'mq_partition_last_seq', labels, previous, seq)
    }
    recorder.add(this.#row, this.#index, this.#slot, count)
    recorder.add(this.#row, this.#index + 1, this.#slot + 1, bytes)
    row[index] = seq
    if (seq > cells.hint[index]) cells.hint[index] = seq
    return true
  }

  /** SPEC §12: resolve a consumer group (same name → same handle). */
  group(name: string, options?: { max_in_flight?: number }): Group {
    validateName('group name', name)
    let maxInFlight = this.#recorder.registry.config.max_in_flight
    if (options !== undefined) {
      if (options === null || typeof options !== 'object') throw new TypeError(`group options must be an object, got ${describe(options)}`)
      for (const key of Object.keys(options)) {
        if (key !== 'max_in_flight') throw new TypeError(`unknown group option ${JSON.stringify(key)} (known: max_in_flight)`)
      }
      const override = options.max_in_flight
      if (override !== undefined) {
        if (typeof override !== 'number' || !Number.isInteger(override) || override < 1 || override > MAX_IN_FLIGHT_LIMIT) {
          throw new RangeError(`max_in_flight must be an integer from 1 to ${MAX_IN_FLIGHT_LIMIT}, got ${describe(override)}`)
        }
        maxInFlight = override
      }
    }
    this.alive()
    let handle = this.#groups.get(name)
    if (handle === undefined) {
      const entity = this.#recorder.registry.group(this.entity, name, maxInFlight)
      handle = new Group(this.#recorder, this, entity)
      this.#groups.set(name, handle)
    }
    if (options?.max_in_flight !== undefined && handle.entity.maxInFlight !== maxInFlight) {
      throw new RangeError(`group ${JSON.stringify(name)} of topic ${JSON.stringify(this.name)} is registered with max_in_flight ${handle.entity.maxInFlight}, not ${maxInFlight}`)
    }
    return handle
  }

  /** Highest last_seq of a partition across every thread, without registering it. */
  lastSeqKnown(partition: number): number {
    const cells = this.knownPartition(partition)
    return cells === undefined ? 0 : this.#lastSeq(cells)
  }

  #lastSeq(cells: PartitionCells): number {
    const { registry } = this.#recorder
    const entity = this.entity.partitions.get(cells.partition)!
    let max = cells.hint[cells.index]
    const c = Math.floor(entity.slot / SLOTS_PER_CHUNK)
    for (let row = 1; row < registry.memory.rowCount(); row++) {
      const chunk = registry.memory.rowChunk(row, c, false)
      if (chunk !== undefined && chunk[cells.index] > max) max = chunk[cells.index]
    }
    return max
  }

  /** Partition cells for this thread, registering the partition if it is new. */
  #resolvePartition(partition: unknown): PartitionCells {
    const number = checkPartition(partition)
    this.alive()
    const entity = this.#recorder.registry.partition(this.entity, number)
    const [row, index] = this.#recorder.cells(entity.slot)
    const [hint] = this.#recorder.sharedCells(entity.slot)
    const cells = new PartitionCells(number, row, index, hint)
    this.#partitions[number] = cells
    return cells
  }

  /** Partition cells if the partition is known (in any thread), else undefined. */
  knownPartition(partition: number): PartitionCells | undefined {
    const cells = this.#partitions[partition]
    if (cells !== undefined) return cells
    this.#recorder.registry.sync()
    return this.entity.partitions.has(partition) ? this.#resolvePartition(partition) : undefined
  }

  ensurePartition(partition: number): PartitionCells {
    return this.#partitions[partition] ?? this.#resolvePartition(partition)
  }

  lastSeqOf(cells: PartitionCells): number {
    return this.#lastSeq(cells)
  }

  #labels(partition: number): Record<string, string> {
    return { topic: this.entity.label, partition: String(partition) }
  }
}

export class Group {
  readonly name: string
  readonly entity: GroupEntity
  readonly topic: Topic
  readonly #recorder: Recorder
  readonly #row: Float64Array
  readonly #index: number
  readonly #slot: number
  readonly #lock: Int32Array
  readonly #lockIndex: number
  readonly #maxInFlight: number
  readonly #floors: ({ row: Float64Array; index: number; hint: Float64Array } | undefined)[] = []

  constructor(recorder: Recorder, topic: Topic, entity: GroupEntity) {
    this.name = entity.name
    this.entity = entity
    this.topic = topic
    this.#recorder = recorder
    this.#slot = entity.slot
    this.#maxInFlight = entity.maxInFlight
    ;[this.#row, this.#index] = recorder.cells(entity.slot)
    this.#lock = recorder.registry.memory.sharedI32(Math.floor(entity.slot / SLOTS_PER_CHUNK))
    this.#lockIndex = (this.#index + G_LOCK) * 2
  }

  // in_flight is kept as per-thread shares (dispatched here − settled here), summed at scrape.
  // Settling — delivered()/dropped(), as frequent as publishing — then costs a plain store while
  // this thread's share covers it; an atomic would cost 8–15 ns here (measured on this machine:
  // Atomics.add ~8 ns, load + compareExchange ~15 ns, a Float64Array add ~3.4 ns). dispatch()
  // takes the group's lock so that the SPEC §5 bound is exact across threads; settlements only
  // lower in_flight, so a dispatch that reads a share a moment old can only be stricter.

  /** SPEC §5: in_flight += n, or false (nothing changes) if that would pass max_in_flight. */
  dispatch(n = 1): boolean {
    checkCount('n', n)
    this.topic.alive()
    const memory = this.#recorder.registry.memory
    acquire(this.#lock, this.#lockIndex, memory.lockTag)
    try {
      if (this.#inFlightAll() + n > this.#maxInFlight) return false
      this.#row[this.#index + G_IN_FLIGHT] += n
      return true
    } finally {
      release(this.#lock, this.#lockIndex)
    }
  }

  /** delivered += n (group and topic), in_flight −= n (SPEC §5: never below 0). */
  delivered(n = 1): void {
    checkCount('n', n)
    this.topic.alive()
    const row = this.#row
    const index = this.#index
    this.#recorder.add(row, index + G_DELIVERED, this.#slot + G_DELIVERED, n)
    const share = row[index + G_IN_FLIGHT]
    if (share >= n) row[index + G_IN_FLIGHT] = share - n
    else this.#settleAcrossThreads(n)
  }

  /** dropped += n (group and topic), in_flight −= n; each drop is credit for one DLQ success. */
  dropped(n = 1): void {
    checkCount('n', n)
    this.topic.alive()
    const row = this.#row
    const index = this.#index
    this.#recorder.add(row, index + G_DROPPED, this.#slot + G_DROPPED, n)
    const share = row[index + G_IN_FLIGHT]
    if (share >= n) row[index + G_IN_FLIGHT] = share - n
    else this.#settleAcrossThreads(n)
  }

  /** retries += n. */
  redelivered(n = 1): void {
    checkCount('n', n)
    this.topic.alive()
    this.#recorder.add(this.#row, this.#index + G_RETRIES, this.#slot + G_RETRIES, n)
  }

  /** SPEC §4: dlq += n, never beyond dropped (fault DLQ_WITHOUT_DROP, nothing counted). */
  deadLettered(n = 1): boolean {
    checkCount('n', n)
    this.topic.alive()
    const row = this.#row
    const index = this.#index
    // Fast path: this thread's own drops cover it. Otherwise check every thread's, under the lock.
    if (row[index + G_DROPPED] - row[index + G_DLQ] < n) {
      const memory = this.#recorder.registry.memory
      acquire(this.#lock, this.#lockIndex, memory.lockTag)
      let credit: number
      try {
        credit = this.#sumAll(G_DROPPED) - this.#sumAll(G_DLQ)
        if (credit >= n) this.#recorder.add(row, index + G_DLQ, this.#slot + G_DLQ, n)
      } finally {
        release(this.#lock, this.#lockIndex)
      }
      if (credit < n) {
        this.#recorder.fault('DLQ_WITHOUT_DROP', 'mq_topic_messages_dlq_total', this.#labels(), credit, n)
        return false
      }
      return true
    }
    this.#recorder.add(row, index + G_DLQ, this.#slot + G_DLQ, n)
    return true
  }

  /** SPEC §5: the ack floor only rises and never passes last_seq (fault ACK_FLOOR_INVALID). */
  ackFloor(partition: number, floor: number): boolean {
    checkPartition(partition)
    checkCount('floor', floor)
    this.topic.alive()
    const partitionCells = this.topic.knownPartition(partition)
    const lastSeq = partitionCells === undefined ? 0 : this.topic.lastSeqOf(partitionCells)
    let cells = this.#floors[partition]
    const current = cells === undefined ? this.#knownFloor(partition) : Math.max(cells.row[cells.index], cells.hint[cells.index])
    if (floor < current || floor > lastSeq) {
      const labels = { topic: this.topic.entity.label, group: this.entity.label, partition: String(partition) }
      this.#recorder.fault('ACK_FLOOR_INVALID', 'mq_group_lag', labels, current, floor)
      return false
    }
    // SPEC §4: an ack floor makes the partition seen (its series appear) — only once accepted.
    if (partitionCells === undefined) this.topic.ensurePartition(partition)
    if (cells === undefined) cells = this.#resolveFloor(partition)
    cells.row[cells.index] = floor
    if (floor > cells.hint[cells.index]) cells.hint[cells.index] = floor
    return true
  }

  /** Current in_flight across every thread. */
  inFlight(): number {
    return Math.max(0, this.#inFlightAll())
  }

  /** This thread's share does not cover the settlement: another thread dispatched it, or nobody did. */
  #settleAcrossThreads(n: number): void {
    const memory = this.#recorder.registry.memory
    let before: number
    acquire(this.#lock, this.#lockIndex, memory.lockTag)
    try {
      before = Math.max(0, this.#inFlightAll())
      this.#row[this.#index + G_IN_FLIGHT] -= Math.min(n, before)
    } finally {
      release(this.#lock, this.#lockIndex)
    }
    if (before < n) {
      // SPEC §5: the delivery/drop happened and is counted; in_flight stays at 0.
      this.#recorder.fault('IN_FLIGHT_UNDERFLOW', 'mq_group_in_flight', this.#labels(), before, before - n)
    }
  }

  #inFlightAll(): number {
    return this.#sumAll(G_IN_FLIGHT)
  }

  /** Σ over every thread's row of one of this group's cells. */
  #sumAll(offset: number): number {
    const memory = this.#recorder.registry.memory
    const c = Math.floor(this.#slot / SLOTS_PER_CHUNK)
    const at = this.#index + offset
    let sum = 0
    for (let row = 1; row < memory.rowCount(); row++) {
      const chunk = row === this.#recorder.row ? this.#row : memory.rowChunk(row, c, false)
      if (chunk !== undefined) sum += chunk[at]
    }
    return sum
  }

  #knownFloor(partition: number): number {
    const registry = this.#recorder.registry
    registry.sync()
    const slot = this.entity.floors.get(partition)
    if (slot === undefined) return 0
    const cells = this.#resolveFloor(partition)
    let max = cells.hint[cells.index]
    const c = Math.floor(slot / SLOTS_PER_CHUNK)
    for (let row = 1; row < registry.memory.rowCount(); row++) {
      const chunk = registry.memory.rowChunk(row, c, false)
      if (chunk !== undefined && chunk[cells.index] > max) max = chunk[cells.index]
    }
    return max
  }

  #resolveFloor(partition: number): { row: Float64Array; index: number; hint: Float64Array } {
    const slot = this.#recorder.registry.floor(this.entity, partition)
    const [row, index] = this.#recorder.cells(slot)
    const [hint] = this.#recorder.sharedCells(slot)
    const cells = { row, index, hint }
    this.#floors[partition] = cells
    return cells
  }

  #labels(): Record<string, string> {
    return { topic: this.topic.entity.label, group: this.entity.label }
  }
}
