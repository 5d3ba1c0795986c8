// The read side: one Snapshot of every live series, summed over the thread rows. Taken under
// the registration lock, so a topic is either wholly registered or absent, never torn, and no
// removal or fold can interleave with the read.
import { Memory, SHARED_ROW, SLOTS_PER_CHUNK } from './memory'
import {
  G_DELIVERED, G_DLQ, G_DROPPED, G_IN_FLIGHT, G_RETRIES, GroupEntity, Registry, TopicEntity,
} from './registry'
import { Count, GroupSnapshot, MAX_SAFE, PartitionSnapshot, TopicSnapshot, addCount } from './snapshot'

const ZERO_ROWS: Float64Array[] = []

/**
 * Where one topic's numbers live, resolved once per registry generation: the Map lookups
 * (partition → slot, group → floor slots) and the sorts then cost nothing on a steady scrape.
 */
interface TopicLayout {
  readonly at: number
  /** Ascending partition numbers, and each one's last_seq slot. */
  readonly partitions: number[]
  readonly lastSeqSlots: number[]
  /** Groups ascending by label then raw name, and [g][p] the slot of g's ack floor on partition p (−1: none). */
  readonly groups: GroupEntity[]
  readonly floorSlots: number[][]
}

export class SnapshotReader {
  readonly #registry: Registry
  readonly #memory: Memory
  // Per slot chunk (index = chunk number), rebuilt per read: the thread rows (≥ 1) that have it,
  // and the shared row's chunk. Arrays, not Maps: a 187k-sample read makes ~260k cell reads,
  // each went through a Map lookup, and the ~210k max-reads (last_seq, floors) also through two
  // more and an Atomics.load for the shared row. With this and TopicLayout, topics() at 4,348
  // topics × 16 partitions × 2 groups measured 34.8 → 13.5 ms (median; best 26.5 → 7.5 ms).
  #rows: (Float64Array[] | undefined)[] = []
  #shared: (Float64Array | undefined)[] = []
  #rowCount = 0
  #sortedTopics: TopicEntity[] = []
  #sortedAt = -1
  readonly #layouts = new WeakMap<TopicEntity, TopicLayout>()

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
    const sorted = this.#sortedTopics
    const out: TopicSnapshot[] = new Array(sorted.length)
    for (let t = 0; t < sorted.length; t++) out[t] = this.#topic(sorted[t])
    return out
  }

  /** One topic again (the conservation checker's confirming re-read). */
  topic(entity: TopicEntity): TopicSnapshot {
    this.#beginRead()
    return this.#topic(entity)
  }

  #beginRead(): void {
    this.#rows = []
    this.#shared = []
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

  #sharedOf(c: number): Float64Array {
    let shared = this.#shared[c]
    if (shared === undefined) {
      shared = this.#memory.rowChunk(SHARED_ROW, c, true)!
      this.#shared[c] = shared
    }
    return shared
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
    let max = this.#sharedOf(c)[index]
    for (let r = 0; r < rows.length; r++) if (rows[r][index] > max) max = rows[r][index]
    return max
  }

  #layout(topic: TopicEntity): TopicLayout {
    const at = this.#registry.generation
    let layout = this.#layouts.get(topic)
    if (layout === undefined || layout.at !== at) {
      const partitions = [...topic.partitions.keys()].sort((a, b) => a - b)
      const groups = [...topic.groups.values()].sort(byLabelThenName)
      layout = {
        at,
        partitions,
        lastSeqSlots: partitions.map((partition) => topic.partitions.get(partition)!.slot),
        groups,
        floorSlots: groups.map((group) => partitions.map((partition) => group.floors.get(partition) ?? -1)),
      }
      this.#layouts.set(topic, layout)
    }
    return layout
  }

  #topic(topic: TopicEntity): TopicSnapshot {
    const { partitions: numbers, lastSeqSlots, groups: groupEntities, floorSlots } = this.#layout(topic)
    const partitionCount = numbers.length
    const groupCount = groupEntities.length
    // Floors first, then last_seq: both only rise, so depth and lag read this way are never < 0.
    const floors: number[][] = new Array(groupCount)
    for (let g = 0; g < groupCount; g++) {
      const slots = floorSlots[g]
      const row: number[] = new Array(partitionCount)
      for (let p = 0; p < partitionCount; p++) row[p] = slots[p] < 0 ? 0 : this.#max(slots[p])
      floors[g] = row
    }
    const partitions: PartitionSnapshot[] = new Array(partitionCount)
    for (let p = 0; p < partitionCount; p++) {
      const lastSeq = this.#max(lastSeqSlots[p])
      let slowest = groupCount === 0 ? 0 : Infinity
      for (let g = 0; g < groupCount; g++) if (floors[g][p] < slowest) slowest = floors[g][p]
      partitions[p] = { partition: numbers[p], lastSeq, depth: lastSeq - slowest }
    }
    let delivered: Count = 0
    let dropped: Count = 0
    let dlq: Count = 0
    const groups: GroupSnapshot[] = new Array(groupCount)
    for (let g = 0; g < groupCount; g++) {
      const group = groupEntities[g]
      const groupFloors = floors[g]
      let lag = 0
      let depth = 0
      for (let p = 0; p < partitionCount; p++) {
        const behind = partitions[p].lastSeq - groupFloors[p]
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
        ackFloors: groupFloors,
        key: group,
      }
      delivered = addCount(delivered, snapshot.delivered)
      dropped = addCount(dropped, snapshot.dropped)
      dlq = addCount(dlq, snapshot.dlq)
      groups[g] = snapshot
    }
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
