// The read side of the counter core: one consistent view of every number, taken by
// `Surface.snapshot()` and consumed by the renderer (/metrics), /stats, /healthz and the
// conservation checker. Nothing here records; nothing here knows which backend is live.

/** An exact non-negative integer. A `number` while it is ≤ 2^53 − 1, a `bigint` above. */
export type Count = number | bigint

/** design §6: 0 healthy, 1 soft, 2 read_only. */
export type QuorumState = 0 | 1 | 2

export interface LatencyQuantiles {
  p50: number
  p90: number
  p99: number
  /** Number of samples in the window the quantiles were read from. */
  count: number
}

/** One partition's numbers as an object: what `surface.snapshot()` lists in `partitions`. */
export interface PartitionSnapshot {
  /** The decimal partition number as given to `produced()` / `ackFloor()`. */
  partition: number
  /** Highest appended seq (0 before the first append). */
  lastSeq: number
  /**
   * design §4: the most any group still owes, max over groups of (lastSeq − its ackFloor − what it
   * settled above the floor); with no group, everything since the partition's base.
   */
  depth: number
}

export interface GroupSnapshot {
  /** Raw name exactly as given to `topic.group()`. */
  name: string
  /** Sanitized label value (design §3.1). */
  label: string
  delivered: Count
  dropped: Count
  dlq: Count
  retries: Count
  inFlight: number
  maxInFlight: number
  /** design §4: max over the topic's partitions of (lastSeq − ackFloor of this group). */
  lag: number
  /** design §4: what this group still owes, Σ over the topic's partitions of (lastSeq − its ackFloor − what it settled above the floor); a bigint past 2^53, as the counters. */
  depth: Count
  /**
   * This group's ack floor on each partition, parallel to `TopicSnapshot.partitionNumbers` (0:
   * none). In the snapshots of /stats and `surface.snapshot()`; the scrape path (/metrics,
   * /healthz) needs only the depth and lag derived from them and leaves them out.
   */
  ackFloors?: readonly number[]
  /**
   * Every partition of the topic has a settlement window of this group (design §5): its in_flight
   * is what send() counted, so in_flight ≤ depth holds whenever no call is under way.
   */
  settledPerMessage: boolean
  /**
   * Settled per message on every partition, or no ackFloor() has moved its floor on a partition
   * without a window of it (entities.ts G_FLOOR_MOVED_INT32, reader.ts floorCanLead): no floor of
   * it leads its counts, so in_flight ≤ depth holds whenever no call is under way, and the
   * conservation check holds it to that.
   */
  inFlightBounded: boolean
  /**
   * design §4: produced − delivered − dropped − depth when the group was registered: 0, unless it
   * started at the partitions' last_seq (`from: 'latest'`) or at committed floors, skipping what
   * was there (a bigint past 2^53 − 1, as the counters).
   */
  start: Count
  /** Stable identity of the live group (same object across snapshots until removal). */
  key: object
}

/**
 * One topic's numbers. Partitions are columns — parallel arrays indexed like `partitionNumbers` —
 * rather than one object each: a 187k-sample scrape read ~70,000 partition objects that lived
 * only until the body was written.
 */
export interface TopicSnapshot {
  /** Raw name exactly as given to `surface.topic()`. */
  name: string
  /** Sanitized label value (design §3.1). */
  label: string
  produced: Count
  bytes: Count
  /**
   * A thread was inside `produced()` at the moment of the read (between its counter and last_seq
   * writes), or held one of the topic's groups' locks when the read ended (reader.ts #locksHeld):
   * the topic's numbers may be torn, so it is not a quiet moment. Absent means false.
   */
  producing?: boolean
  /** Topic totals: the sum over the topic's groups (design §4). */
  delivered: Count
  dropped: Count
  dlq: Count
  /** Ascending partition numbers (frozen; the same array across snapshots while the set is unchanged). */
  partitionNumbers: readonly number[]
  /** Highest appended seq of each partition (0 before the first append). */
  lastSeq: readonly number[]
  /** Per partition, as PartitionSnapshot.depth (design §4). */
  depth: readonly number[]
  /** Ascending by label, then by raw name (JS string order). */
  groups: GroupSnapshot[]
  /** Stable identity of the live topic (same object across snapshots until removeTopic). */
  key: object
  /**
   * On the first live topic of a label that removed topics or groups shared (design §3.5): what
   * they left in the label's series, which the exposition adds to it. Absent otherwise. Never in
   * `surface.snapshot()` (each raw name's own numbers); /stats shows it in the collisions view.
   */
  carried?: Carried
  /**
   * A group left this topic by removeGroup() within the last 5 minutes (lib/core/left.ts): /metrics
   * shows its groups without their retries series. Never in `surface.snapshot()` nor /stats.
   */
  groupLeft?: boolean
}

/** What removed names left in their label's series (reader.ts: retired and retiring, summed). */
export interface Carried {
  produced: Count
  bytes: Count
  delivered: Count
  dropped: Count
  dlq: Count
  /** Partition number → the highest last_seq a removed topic of the label reached there. */
  lastSeq: ReadonlyMap<number, number>
  /** Group label → retries of the removed groups with that label. */
  retries: ReadonlyMap<string, Count>
}

/**
 * A snapshot's structure, as opposed to its numbers: which topics there are and in what order,
 * their labels, groups and partition numbers. The reader hands out one object per registry
 * generation (every registration, partition, group, floor or removal starts a new one), the
 * same object with every snapshot of that generation; a consumer may keep what it derives from
 * the structure alone by this object's identity.
 */
export interface Layout {
  /** `hasNoCollisions` of the topics (design §3.5), computed once for the generation. */
  readonly collisionFree: boolean
}

/** Just what `hasNoCollisions` reads: a snapshot's topics, or the registry's entities. */
interface Labelled {
  readonly label: string
  readonly partitionNumbers: readonly number[]
  readonly groups: readonly { readonly label: string }[]
  readonly carried?: Carried
}

/**
 * Topics strictly ascending by label, and in each, partition numbers strictly ascending and
 * groups strictly ascending by label: no two series of a family share a label set (design §3.5),
 * and the lines come out in the order the exposition lists them.
 */
export function hasNoCollisions(topics: readonly Labelled[]): boolean {
  for (let t = 0; t < topics.length; t++) {
    if (t > 0 && !(topics[t].label > topics[t - 1].label)) return false
    if (!isCollisionFree(topics[t])) return false
  }
  return true
}

/** One topic's partition numbers strictly ascending, its groups strictly ascending by label, and nothing carried. */
export function isCollisionFree(topic: Labelled): boolean {
  if (topic.carried !== undefined) return false
  const { partitionNumbers, groups } = topic
  for (let p = 1; p < partitionNumbers.length; p++) if (!(partitionNumbers[p] > partitionNumbers[p - 1])) return false
  for (let g = 1; g < groups.length; g++) if (!(groups[g].label > groups[g - 1].label)) return false
  return true
}

export interface Snapshot {
  /** process uptime in seconds (the one number that moves with time alone). */
  uptimeSeconds: number
  connections: number
  leaderEpoch: number
  quorumState: QuorumState
  /** From the last replication round (0 / 0 before the first round). */
  replicas: number
  inSync: number
  /** The replicas out of sync, as the last round named them ([] when it said none lags); null when it did not name them. */
  lagging: readonly string[] | null
  /** null when the estimator is disabled or the window is empty (no samples). */
  latency: LatencyQuantiles | null
  /** Ascending by label, then by raw name (JS string order). */
  topics: TopicSnapshot[]
  /** The structure's identity and what is known of it (set by the reader; absent: unknown). */
  layout?: Layout
}

/** What `surface.snapshot()` returns: a Snapshot whose topics also list their partitions as objects. */
export interface SnapshotWithPartitions extends Omit<Snapshot, 'layout'> {
  topics: (TopicSnapshot & { partitions: PartitionSnapshot[] })[]
}

/**
 * `snapshot` with each topic's `partitions` objects added (the scrape path never needs them). The
 * partition numbers are copied: the reader shares the registry's own array, which a caller must
 * not be able to change. Each topic is one object literal with its fields spelled out: a spread
 * (`{ ...topic, partitions }`) gave nearly every topic a hidden class of its own (4,643 for
 * 4,651 topics), which made every field read of a caller's loop over the topics megamorphic.
 */
export function withPartitions(snapshot: Snapshot): SnapshotWithPartitions {
  const topics = snapshot.topics
  const out: SnapshotWithPartitions['topics'] = new Array(topics.length)
  for (let t = 0; t < topics.length; t++) {
    const topic = topics[t]
    const numbers = topic.partitionNumbers
    const partitions: PartitionSnapshot[] = new Array(numbers.length)
    for (let p = 0; p < numbers.length; p++) partitions[p] = { partition: numbers[p], lastSeq: topic.lastSeq[p], depth: topic.depth[p] }
    // The fields in TopicSnapshot's order: the JSON of a snapshot is what it always was.
    out[t] = {
      name: topic.name,
      label: topic.label,
      produced: topic.produced,
      bytes: topic.bytes,
      producing: topic.producing === true,
      delivered: topic.delivered,
      dropped: topic.dropped,
      dlq: topic.dlq,
      partitionNumbers: numbers.slice(),
      lastSeq: topic.lastSeq,
      depth: topic.depth,
      groups: topic.groups,
      key: topic.key,
      partitions,
    }
  }
  // The layout is the library's own bookkeeping, not part of what a caller is shown.
  const { layout: _layout, ...rest } = snapshot
  return { ...rest, topics: out }
}

export const MAX_SAFE = Number.MAX_SAFE_INTEGER

/** Exact sum of two Counts; promotes to bigint only when the result leaves the safe range. */
export function addCount(a: Count, b: Count): Count {
  if (typeof a === 'number' && typeof b === 'number') {
    const sum = a + b
    if (sum <= MAX_SAFE) return sum
  }
  const big = BigInt(a) + BigInt(b)
  return big <= BigInt(MAX_SAFE) ? Number(big) : big
}
