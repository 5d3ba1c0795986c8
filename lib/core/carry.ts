// The carry (design §3.5, docs/reclamation.md): what removed topics and groups left in the series
// of a label they shared with live names, and how it is written to the registration log. The
// registry decides what is carried (at each removal) and replays the entries into every thread's
// picture; the reader adds the cells of what still retires; the exposition adds both to the series.
import { CarryKind, Entry, amountRows, wide } from './log'
import { Count, addCount } from './snapshot'

/** Partitions per Entry.Carries (an entry must fit a log chunk). */
const CARRIES_PER_ENTRY = 1024

/**
 * One label's carry: counters keep growing from where the merged series stood, and last_seq keeps
 * its highest value, as long as a live topic has the label. Only what a live name still shows is
 * kept: last_seq for the partitions a live topic of the label has, retries for the group labels a
 * live group has (the registry prunes the rest at each removal).
 */
export class LabelCarry {
  produced: Count = 0
  bytes: Count = 0
  delivered: Count = 0
  dropped: Count = 0
  dlq: Count = 0
  /** Partition number → the highest last_seq a removed topic of the label reached there. */
  readonly lastSeq = new Map<number, number>()
  /** Group label → the retries of the removed groups with that label. */
  readonly retries = new Map<string, Count>()

  /** What one Entry.Carry adds: `amount` of `kind` (last_seq: the highest wins, on `partition`; retries: of `groupLabel`). */
  add(kind: CarryKind, partition: number, amount: Count, groupLabel: string): void {
    switch (kind) {
      case CarryKind.Produced: this.produced = addCount(this.produced, amount); break
      case CarryKind.Bytes: this.bytes = addCount(this.bytes, amount); break
      case CarryKind.Delivered: this.delivered = addCount(this.delivered, amount); break
      case CarryKind.Dropped: this.dropped = addCount(this.dropped, amount); break
      case CarryKind.Dlq: this.dlq = addCount(this.dlq, amount); break
      case CarryKind.LastSeq: this.lastSeq.set(partition, Math.max(this.lastSeq.get(partition) ?? 0, Number(amount))); break
      case CarryKind.Retries: this.retries.set(groupLabel, addCount(this.retries.get(groupLabel) ?? 0, amount)); break
    }
  }

  /** The entries that restate this carry in a checkpoint, on `topicId` (a live topic of its label). */
  entries(topicId: number): [Entry, number[], string?][] {
    const counters = [[CarryKind.Produced, this.produced], [CarryKind.Bytes, this.bytes], [CarryKind.Delivered, this.delivered], [CarryKind.Dropped, this.dropped], [CarryKind.Dlq, this.dlq]] as const
    return [
      ...counters.flatMap(([kind, amount]) => carryEntries(topicId, kind, 0, BigInt(amount))),
      ...[...this.lastSeq].flatMap(([partition, lastSeq]) => carryEntries(topicId, CarryKind.LastSeq, partition, BigInt(lastSeq))),
      ...[...this.retries].flatMap(([groupLabel, retries]) => carryEntries(topicId, CarryKind.Retries, 0, BigInt(retries), groupLabel)),
    ]
  }
}

/** Entry.Carry entries adding `amount` (split where it passes one entry's 64 bits) of `kind` to the carry of `topicId`'s label. */
export function carryEntries(topicId: number, kind: CarryKind, partition: number, amount: bigint, groupLabel?: string): [Entry, number[], string?][] {
  if (amount === 0n) return []
  return amountRows([amount]).map(([part]) => [Entry.Carry, [...wide(topicId), kind, partition, ...wide(part)], groupLabel])
}

/** Entry.Carries entries restating a retiring topic's carried partitions (checkpoints only). */
export function carriesEntries(topicId: number, partitions: readonly number[]): [Entry, number[]][] {
  const entries: [Entry, number[]][] = []
  for (let at = 0; at < partitions.length; at += CARRIES_PER_ENTRY) entries.push([Entry.Carries, [...wide(topicId), ...partitions.slice(at, at + CARRIES_PER_ENTRY)]])
  return entries
}
