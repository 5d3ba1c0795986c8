// Series after the collision merge (design §3.5): two topic names that sanitize to the same label
// value are one series (counts summed, last_seq and lag the maximum), which keeps what removed
// names of the label left in it (TopicSnapshot.carried). A snapshot without
// collisions already has this shape and is used as it is; only colliding topics and groups get
// merged copies.
import { Count, TopicSnapshot, addCount, isCollisionFree } from '../core/snapshot'

export interface GroupSeries {
  readonly label: string
  readonly key: object
  readonly lag: number
  readonly inFlight: Count
  readonly retries: Count
}

export interface TopicSeries {
  readonly label: string
  readonly key: object
  readonly produced: Count
  readonly delivered: Count
  readonly dropped: Count
  readonly dlq: Count
  readonly bytes: Count
  /** Ascending partition numbers; `lastSeq` and `depth` are parallel to it. */
  readonly partitionNumbers: readonly number[]
  readonly lastSeq: readonly number[]
  readonly depth: readonly Count[]
  readonly groups: readonly GroupSeries[]
  /** A group left the topic lately (lib/core/left.ts): its groups' retries lines are left out. */
  readonly groupLeft?: boolean
}

/**
 * One series per distinct topic label, ascending by label; inside each, one partition series per
 * partition number (ascending) and one group series per group label (ascending). Relies on the
 * snapshot's documented order to find collisions as neighbours, and checks that order rather than
 * trusting it: an out-of-order snapshot is sorted first, never rendered with duplicates.
 */
export function mergeCollisions(snapshotTopics: readonly TopicSnapshot[]): readonly TopicSeries[] {
  let topics = snapshotTopics
  for (let i = 1; i < topics.length; i++) {
    if (topics[i].label < topics[i - 1].label) {
      topics = [...topics].sort((a, b) => compareStrings(a.label, b.label) || compareStrings(a.name, b.name))
      break
    }
  }
  const series: TopicSeries[] = []
  for (let i = 0; i < topics.length; ) {
    let end = i + 1
    while (end < topics.length && topics[end].label === topics[i].label) end++
    series.push(end === i + 1 && isCollisionFree(topics[i]) ? topics[i] : mergeTopics(topics.slice(i, end)))
    i = end
  }
  return series
}

/** design §3.5: counters, depth and in_flight summed; last_seq and lag take the maximum. */
function mergeTopics(run: readonly TopicSnapshot[]): TopicSeries {
  let produced: Count = 0
  let delivered: Count = 0
  let dropped: Count = 0
  let dlq: Count = 0
  let bytes: Count = 0
  const partitions = new Map<number, { depth: Count; lastSeq: number }>()
  const groups = new Map<string, { label: string; key: object; lag: number; inFlight: Count; retries: Count }>()
  for (const topic of run) {
    produced = addCount(produced, topic.produced)
    delivered = addCount(delivered, topic.delivered)
    dropped = addCount(dropped, topic.dropped)
    dlq = addCount(dlq, topic.dlq)
    bytes = addCount(bytes, topic.bytes)
    topic.partitionNumbers.forEach((partition, p) => {
      const merged = partitions.get(partition)
      if (merged === undefined) {
        partitions.set(partition, { depth: topic.depth[p], lastSeq: topic.lastSeq[p] })
      } else {
        merged.depth = addCount(merged.depth, topic.depth[p])
        if (topic.lastSeq[p] > merged.lastSeq) merged.lastSeq = topic.lastSeq[p]
      }
    })
    for (const g of topic.groups) {
      const merged = groups.get(g.label)
      if (merged === undefined) {
        groups.set(g.label, { label: g.label, key: g.key, lag: g.lag, inFlight: g.inFlight, retries: g.retries })
      } else {
        if (g.lag > merged.lag) merged.lag = g.lag
        merged.inFlight = addCount(merged.inFlight, g.inFlight)
        merged.retries = addCount(merged.retries, g.retries)
      }
    }
  }
  // What removed names left (design §3.5), added where a live name keeps the series.
  for (const topic of run) {
    const carried = topic.carried
    if (carried === undefined) continue
    produced = addCount(produced, carried.produced)
    delivered = addCount(delivered, carried.delivered)
    dropped = addCount(dropped, carried.dropped)
    dlq = addCount(dlq, carried.dlq)
    bytes = addCount(bytes, carried.bytes)
    for (const [partition, lastSeq] of carried.lastSeq) {
      const merged = partitions.get(partition)
      if (merged !== undefined && lastSeq > merged.lastSeq) merged.lastSeq = lastSeq
    }
    for (const [label, retries] of carried.retries) {
      const merged = groups.get(label)
      if (merged !== undefined) merged.retries = addCount(merged.retries, retries)
    }
  }
  const partitionNumbers = [...partitions.keys()].sort((a, b) => a - b)
  return {
    label: run[0].label,
    key: run[0].key,
    produced,
    delivered,
    dropped,
    dlq,
    bytes,
    partitionNumbers,
    lastSeq: partitionNumbers.map((partition) => partitions.get(partition)!.lastSeq),
    depth: partitionNumbers.map((partition) => partitions.get(partition)!.depth),
    groups: [...groups.values()].sort((a, b) => compareStrings(a.label, b.label)),
    groupLeft: run.some((topic) => topic.groupLeft === true),
  }
}

export function compareStrings(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0
}

