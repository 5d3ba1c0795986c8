// The read side: one Snapshot of every live series, summed over the thread rows. Taken under
// the registration lock, so a topic is either wholly registered or absent, never torn, and no
// removal or fold can interleave with the read.
import { Memory, SHARED_ROW, SLOTS_PER_CHUNK } from './memory'
import {
  G_DELIVERED, G_DLQ, G_DROPPED, G_IN_FLIGHT, G_RETRIES, GroupEntity, Registry, TopicEntity,
} from './registry'
import { Count, GroupSnapshot, MAX_SAFE, PartitionSnapshot, TopicSnapshot, addCount } from './snapshot'

const ZERO_ROWS: Float64Array[] = []

export class SnapshotReader {
  readonly #registry: Registry
  readonly #memory: Memory
  /** Per slot chunk: the thread rows that have it (rows ≥ 1), rebuilt per read. */
  #rows = new Map<number, Float64Array[]>()
  #rowCount = 0
  #sortedTopics: TopicEntity[] = []
  #sortedAt = -1
  readonly #topicOrder = new WeakMap<TopicEntity, { at: number; partitions: number[]; groups: GroupEntity[] }>()

  constructor(registry: Registry) {
    this.#registry = registry
    this.#memory = registry.memory
  }

  /** Every live topic, ascending by label then raw name. Caller holds the lock and has synced. */
  topics(): TopicSnapshot[] {
    this.#beginRead()
    const registry = this.#registry
    if (this.#sortedAt !== registry.generation) {
      this.#sortedTopics = [...registry.topics.values()].sort(byLabelThenName)
      this.#sortedAt = registry.generation
    }
    return this.#sortedTopics.map((topic) => this.#topic(topic))
  }

  /** One topic again (the conservation checker's confirming re-read). */
  topic(entity: TopicEntity): TopicSnapshot {
    this.#beginRead()
    return this.#topic(entity)
  }

  #beginRead(): void {
    this.#rows.clear()
    this.#rowCount = this.#memory.rowCount()
  }

  #rowsOf(c: number): Float64Array[] {
    let rows = this.#rows.get(c)
    if (rows === undefined) {
      rows = []
      for (let row = 1; row < this.#rowCount; row++) {
        const chunk = this.#memory.rowChunk(row, c, false)
        if (chunk !== undefined) rows.push(chunk)
      }
      this.#rows.set(c, rows.length ? rows : ZERO_ROWS)
    }
    return rows
  }

  #shared(c: number): Float64Array {
    return this.#memory.rowChunk(SHARED_ROW, c, true)!
  }

  #count(slot: number): Count {
    const rows = this.#rowsOf(Math.floor(slot / SLOTS_PER_CHUNK))
    const index = slot % SLOTS_PER_CHUNK
    let sum = 0
    for (let r = 0; r < rows.length; r++) sum += rows[r][index]
    const folded = this.#registry.folds.size === 0 ? undefined : this.#registry.folds.get(slot)
    if (sum <= MAX_SAFE && folded === undefined) return sum
    // Past 2^53 a double sum is no longer exact: redo it in bigint (SPEC §2: 64-bit counters).
    let exact = folded ?? 0n
    for (let r = 0; r < rows.length; r++) exact += BigInt(rows[r][index])
    return exact <= BigInt(MAX_SAFE) ? Number(exact) : exact
  }

  /** Plain sum over the rows (a signed cell, far from 2^53). */
  #sum(slot: number): number {
    const rows = this.#rowsOf(Math.floor(slot / SLOTS_PER_CHUNK))
    const index = slot % SLOTS_PER_CHUNK
    let sum = 0
    for (let r = 0; r < rows.length; r++) sum += rows[r][index]
    return sum
  }

  /** Highest value any thread wrote (last_seq, ack floors: monotone per thread). */
  #max(slot: number): number {
    const c = Math.floor(slot / SLOTS_PER_CHUNK)
    const rows = this.#rowsOf(c)
    const index = slot % SLOTS_PER_CHUNK
    let max = this.#shared(c)[index]
    for (let r = 0; r < rows.length; r++) if (rows[r][index] > max) max = rows[r][index]
    return max
  }

  #order(topic: TopicEntity): { partitions: number[]; groups: GroupEntity[] } {
    const at = this.#registry.generation
    let order = this.#topicOrder.get(topic)
    if (order === undefined || order.at !== at) {
      order = {
        at,
        partitions: [...topic.partitions.keys()].sort((a, b) => a - b),
        groups: [...topic.groups.values()].sort(byLabelThenName),
      }
      this.#topicOrder.set(topic, order)
    }
    return order
  }

  #topic(topic: TopicEntity): TopicSnapshot {
    const { partitions: numbers, groups: groupEntities } = this.#order(topic)
    // Floors first, then last_seq: both only rise, so depth and lag read this way are never < 0.
    const floors = groupEntities.map((group) =>
      numbers.map((partition) => {
        const slot = group.floors.get(partition)
        return slot === undefined ? 0 : this.#max(slot)
      }),
    )
    const partitions: PartitionSnapshot[] = numbers.map((partition, p) => {
      const lastSeq = this.#max(topic.partitions.get(partition)!.slot)
      let slowest = groupEntities.length === 0 ? 0 : Infinity
      for (let g = 0; g < floors.length; g++) if (floors[g][p] < slowest) slowest = floors[g][p]
      return { partition, lastSeq, depth: lastSeq - slowest }
    })
    let delivered: Count = 0
    let dropped: Count = 0
    let dlq: Count = 0
    const groups: GroupSnapshot[] = groupEntities.map((group, g) => {
      let lag = 0
      let depth = 0
      for (let p = 0; p < partitions.length; p++) {
        const behind = partitions[p].lastSeq - floors[g][p]
        if (behind > lag) lag = behind
        depth += behind
      }
      // Σ of the per-thread shares; racing settlements of one message in two threads (a broker
      // bug) could leave it below 0 for a moment — SPEC §5 says it never shows below 0.
      const inFlight = Math.max(0, this.#sum(group.slot + G_IN_FLIGHT))
      const snapshot: GroupSnapshot = {
        name: group.name,
        label: group.label,
        delivered: this.#count(group.slot + G_DELIVERED),
        dropped: this.#count(group.slot + G_DROPPED),
        dlq: this.#count(group.slot + G_DLQ),
        retries: this.#count(group.slot + G_RETRIES),
        inFlight,
        maxInFlight: group.maxInFlight,
        lag,
        depth,
        ackFloors: floors[g],
        key: group,
      }
      delivered = addCount(delivered, snapshot.delivered)
      dropped = addCount(dropped, snapshot.dropped)
      dlq = addCount(dlq, snapshot.dlq)
      return snapshot
    })
    return {
      name: topic.name,
      label: topic.label,
      produced: this.#count(topic.slot),
      bytes: this.#count(topic.slot + 1),
      delivered,
      dropped,
      dlq,
      partitions,
      groups,
      key: topic,
    }
  }
}

function byLabelThenName(a: { label: string; name: string }, b: { label: string; name: string }): number {
  if (a.label !== b.label) return a.label < b.label ? -1 : 1
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0
}
