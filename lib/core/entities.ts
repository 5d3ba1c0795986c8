// What a name is registered as: a topic's or group's block of slots (the cells of its counters in
// every thread's row and in the shared row), and the entities each thread's registry holds.
import { Count } from './snapshot'

// Slot block sizes. Thread rows use the counter cells; the shared row uses the rest.
export const TOPIC_SLOTS = 3 // rows: produced, bytes, writing marker · shared: +0 liveness tag (the topic id), +1 partitions registered (Int32), +2 when a group last left (T_GROUP_LEFT)
export const PARTITION_SLOTS = 3 // rows: last_seq · shared: last_seq hint (max seen by any thread), +1 base (the seq before the partition's first message), +2 append() lock (Int32)
export const P_BASE = 1
export const P_LOCK = 2
export const GROUP_SLOTS = 6 // rows: delivered, dropped, dlq, retries, in_flight share · shared: +0 liveness tag (the group id), +1 start balance (its low 32 bits), +2 conservation episode (Int32), +3 partitions settled per message (Int32), +4 start balance (the bits above), +5 dispatch lock (Int32)
export const FLOOR_SLOTS = 1 // rows: ack_floor · shared: ack_floor hint
export const G_DELIVERED = 0
export const G_DROPPED = 1
export const G_DLQ = 2
export const G_RETRIES = 3
/** This thread's share of in_flight: dispatched here − settled here (may be < 0, see group.ts). */
export const G_IN_FLIGHT = 4
export const G_LOCK = 5
/** In the shared row: the group's liveness tag (its id while it lives, else 0). */
export const G_TAG = 0
/**
 * Shared row: the group's balance at registration (design §4: what a `from: 'latest'` or committed
 * start skipped), exact past 2^53 (one partition's share is below it, their sum need not be): its
 * low 32 bits at G_START, the bits above at G_START_HIGH.
 */
export const G_START = 1
export const G_START_HIGH = 4
/**
 * Shared row, as an Int32 cell of bits (conservation.ts Episode): set while an episode of the
 * group (CONSERVATION_BROKEN, IN_FLIGHT_EXCEEDS_DEPTH) has been reported and has not ended. Shared
 * so that the checkers of several threads (the main thread's, the scrape thread's) report each
 * episode once between them.
 */
export const G_EPISODE = 2
/**
 * Shared row, as Int32 cells: how many partitions the topic has registered (T_PARTITIONS, in the
 * topic's block) and on how many the group has a settlement window (G_WINDOWED, in the group's),
 * so that dispatch() tells a group settled per message on every partition without its thread's
 * registry (group.ts). Written with Atomics under the registration lock, each as the exact number
 * the writer's registry then holds: by the registering thread, the partitions before its entry is
 * published and the windows after it, so that a thread terminated in between leaves them letting
 * dispatch() through (partitions one too high, windows one too low), never refusing wrongly. Such
 * a thread leaves the registration lock held; the thread that takes it over (memory.ts lock())
 * flags C_RECOUNT, as a registration that throws does (registry.ts #appendCounted), and the next
 * catch-up under the lock writes every live topic's and group's counts anew (caught up, a live
 * entity owns its block; never while replaying: a block named by an old entry may be reused since).
 */
export const T_PARTITIONS = 1
/**
 * Shared row: when a group of the topic last left by removeGroup() (ms on left.ts's clock; 0: none
 * since the block was handed out). Written under the registration lock before the removal is
 * published, read by every scrape: for LEFT_MS after it the topic's groups show no retries series
 * (docs/metrics.md, "A group that left").
 */
export const T_GROUP_LEFT = 2
export const G_WINDOWED = 3
/**
 * Shared row, as the Int32 cell after G_WINDOWED's (the upper half of its slot): which partitions'
 * floors ackFloor() has moved, a bit per class of partitions (floorMovedBit: partition mod 32); 0
 * before any. Only such a floor moves ahead of the counts that go with it (ackFloor() before
 * delivered()): a floor a group started at (`from`), or one expire() moved with its drops, never
 * does. So a group with no floor whose bit is set on a partition without a window of it never
 * shows more in flight than it owes except by a mistake: the conservation check holds it to
 * in_flight ≤ depth (conservation.ts, reader.ts floorCanLead). A bit is set before the floor is
 * written, never cleared while the group lives; partitions that share a class share a bit (the
 * check then leaves the group alone: never a false alarm).
 */
export const G_FLOOR_MOVED_INT32 = 1
/** The bit of G_FLOOR_MOVED_INT32 that stands for `partition`. */
export function floorMovedBit(partition: number): number {
  return 1 << (partition & 31)
}
/**
 * A settlement window's header: a block of its own (W_HEADER slots, shared row only), apart from
 * the window's bits, so that a window's block is its bits alone (a whole number of 64-byte lines;
 * two of the largest fill one chunk). In it: the window's base + 1 (0: not yet initialized)…
 */
export const W_BASE = 0
/** …and how many seqs above the floor are settled (the group no longer owes them: design §4). */
export const W_SETTLED = 1
/**
 * …and, while a call moves the floor over settled seqs, the new floor + 1 (0 otherwise): it is
 * written before the bits of the seqs passed over are cleared, so a thread stopped in between
 * (a worker terminated) leaves a move the lock's next holder finishes (window.ts).
 */
export const W_PENDING = 2
/** A header's slots: the three above and one unused, so that two headers share a 64-byte line and none straddles two. */
export const W_HEADER = 4
/** A settlement window spans this many seqs above the floor unless the group says otherwise. */
export const DEFAULT_SETTLE_WINDOW = 1024
/** Slots of a settlement window of `seqs` seqs: two bits per seq (in flight, then settled); its header is a block of its own (W_HEADER). */
export function windowSlots(seqs: number): number {
  return seqs / 32
}

/** How often an allocation may ask /proc whether a lagging thread has exited. */
export const GONE_CHECK_MS = 5

/** Shared by every entity that has none yet (never mutated). */
export const NONE: readonly number[] = Object.freeze([])

// Partitions and ack floors are sorted arrays, not Maps: partition numbers are usually dense small
// integers, and at 4,348 topics × 16 partitions × 2 groups the Maps and one PartitionEntity per
// partition cost ~70 B per sample. The arrays are replaced on change, never mutated in place, so
// a snapshot can share them (registration is rare; a copy per registration is cheap).

export class GroupEntity {
  /** False once removed (with its topic, or by removeGroup). */
  alive = true
  /** While it retires (removed, its last counts still adding to its topic's): its removal's epoch. */
  retireEpoch = 0
  /**
   * While it retires: whether its retries stay in its label's series (design §3.5) — decided at
   * its removal (another live group had its label), false once no live group has it any more.
   */
  carries = false
  /**
   * Partitions this group has an ack floor on, ascending, and the slot of each floor (parallel).
   * Replaced, never mutated. While the group has a floor on every partition of its topic,
   * `floorPartitions` is the topic's own `partitionNumbers` array (one copy, and the reader can
   * index both alike).
   */
  floorPartitions: readonly number[] = NONE
  floorSlots: readonly number[] = NONE
  /** Partitions this group settles per message on, ascending, and each one's window block and header block (parallel). */
  windowPartitions: readonly number[] = NONE
  windowSlots: readonly number[] = NONE
  windowHeaders: readonly number[] = NONE
  constructor(
    readonly topic: TopicEntity,
    readonly id: number,
    readonly name: string,
    readonly label: string,
    readonly slot: number,
    readonly maxInFlight: number,
    /** Seqs a settlement window spans above the floor (a multiple of 32). */
    readonly window: number,
  ) {}

  /** The slot of this group's settlement window on `partition`, or undefined before it has one. */
  windowSlot(partition: number): number | undefined {
    const at = indexOf(this.windowPartitions, partition)
    return at < 0 ? undefined : this.windowSlots[at]
  }

  /** The slot of the header of this group's settlement window on `partition`, or undefined before it has one. */
  windowHeader(partition: number): number | undefined {
    const at = indexOf(this.windowPartitions, partition)
    return at < 0 ? undefined : this.windowHeaders[at]
  }

  /** The slot of this group's ack floor on `partition`, or undefined before it has one. */
  floorSlot(partition: number): number | undefined {
    const at = indexOf(this.floorPartitions, partition)
    return at < 0 ? undefined : this.floorSlots[at]
  }

  /** A snapshot's `key` is an identity, not data: JSON.stringify(snapshot) leaves it out (it links back to the topic). */
  toJSON(): undefined {
    return undefined
  }
}

export class TopicEntity {
  alive = true
  /**
   * While it retires into its label's carry (removed while another live topic has its label, its
   * last counts still adding to the shared series): its removal's epoch. 0 otherwise.
   */
  retireEpoch = 0
  /**
   * While it retires into its label's carry: the partitions whose last_seq stays in the label's
   * series (a live topic of the label had them at its removal, and has had them since).
   */
  carriedPartitions: Set<number> | undefined
  /** Ascending partition numbers and the slot of each one's last_seq (parallel). Replaced, never mutated. */
  partitionNumbers: readonly number[] = NONE
  partitionSlots: readonly number[] = NONE
  /**
   * The live groups, ascending by label, then by raw name (JS string order). Replaced, never
   * mutated: a reader that holds it across registrations reads the groups of its moment. Built
   * when read after groups came or went (addGroup, dropGroup), so that a burst of registrations
   * on one topic (a broker's clients resubscribing after a restart) sorts once, not once each.
   */
  get groups(): readonly GroupEntity[] {
    if (this.#added.length !== 0 || this.#gone !== undefined) this.#build()
    return this.#groups
  }
  #groups: readonly GroupEntity[] = []
  /** Registered since `groups` was built, in registration order. */
  #added: GroupEntity[] = []
  /** Removed since `groups` was built (from it, or from #added). */
  #gone: Set<GroupEntity> | undefined
  /**
   * Removed groups whose counts still add to the topic's delivered, dropped and dlq until they
   * retire (a call under way when the group was removed may still land in their cells).
   */
  retiring: readonly GroupEntity[] = []
  /** What retired groups delivered, dropped and dead-lettered: topic counters never go down. */
  retiredDelivered: Count = 0
  retiredDropped: Count = 0
  retiredDlq: Count = 0
  constructor(readonly id: number, readonly name: string, readonly label: string, readonly slot: number) {}

  /** The slot of `partition`'s last_seq, or undefined before the partition is seen. */
  partitionSlot(partition: number): number | undefined {
    const at = indexOf(this.partitionNumbers, partition)
    return at < 0 ? undefined : this.partitionSlots[at]
  }

  /** The live groups by raw name: the same groups as `groups`, but for #twins. */
  readonly groupsByName = new Map<string, GroupEntity>()
  /**
   * Live groups whose name a group registered before them has too, oldest first: a checkpoint
   * replayed by a thread that never saw a removal registers the newer group before the older one
   * is forgotten, in either order. The name is the oldest's until it goes, as in `groups`.
   */
  #twins: GroupEntity[] = []
  /** The live groups, and how many of them have each group label. */
  readonly #live = new Set<GroupEntity>()
  readonly #labels = new Map<string, number>()

  /** The group registered under this raw name. */
  group(name: string): GroupEntity | undefined {
    return this.groupsByName.get(name)
  }

  /** A group registered (picture.ts): live from now on. */
  addGroup(group: GroupEntity): void {
    this.#live.add(group)
    this.#labels.set(group.label, (this.#labels.get(group.label) ?? 0) + 1)
    this.#added.push(group)
    if (this.groupsByName.has(group.name)) this.#twins.push(group)
    else this.groupsByName.set(group.name, group)
    this.#bounded()
  }

  /** A group removed or forgotten (picture.ts): no longer live. Its name goes to a twin, if it has one. */
  dropGroup(group: GroupEntity): void {
    if (!this.#live.delete(group)) return // removed, then forgotten: gone once
    const left = this.#labels.get(group.label)! - 1
    if (left === 0) this.#labels.delete(group.label)
    else this.#labels.set(group.label, left)
    ;(this.#gone ??= new Set()).add(group)
    if (this.#twins.length !== 0) this.#twins = this.#twins.filter((twin) => twin !== group)
    if (this.groupsByName.get(group.name) === group) {
      this.groupsByName.delete(group.name)
      const twin = this.#twins.findIndex((other) => other.name === group.name)
      if (twin >= 0) this.groupsByName.set(group.name, this.#twins.splice(twin, 1)[0])
    }
    this.#bounded()
  }

  /** Whether a live group of this topic (but `except`) has the group label `label`. */
  hasGroupLabel(label: string, except?: GroupEntity): boolean {
    const count = this.#labels.get(label) ?? 0
    return count > (except !== undefined && except.label === label && this.#live.has(except) ? 1 : 0)
  }

  /**
   * Built once what came and went since outnumbers the list (and 1,024): a thread that never reads
   * `groups` (a recording worker between compactions) holds removed groups no longer than that,
   * and each build still covers as many calls as it copies groups.
   */
  #bounded(): void {
    if (this.#added.length + (this.#gone?.size ?? 0) > this.#groups.length + 1024) this.#build()
  }

  /** `groups` anew: what stays of it, merged with what came since, sorted. */
  #build(): void {
    const gone = this.#gone
    const kept = gone === undefined ? this.#groups : this.#groups.filter((group) => !gone.has(group))
    const added = (gone === undefined ? this.#added : this.#added.filter((group) => !gone.has(group))).sort(byLabelThenName)
    const out: GroupEntity[] = new Array(kept.length + added.length) // sized exactly
    for (let i = 0, j = 0, o = 0; o < out.length; o++) out[o] = j === added.length || (i < kept.length && byLabelThenName(kept[i], added[j]) <= 0) ? kept[i++] : added[j++]
    this.#groups = out
    this.#added = []
    this.#gone = undefined
  }

  /** As GroupEntity's: JSON.stringify(snapshot) leaves a snapshot's `key` out. */
  toJSON(): undefined {
    return undefined
  }
}

/** Index of `partition` in an ascending array, or −1. Dense partitions 0…n−1 sit at their own index. */
export function indexOf(numbers: readonly number[], partition: number): number {
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
export function inserted(numbers: readonly number[], values: readonly number[], partition: number, value: number): [number[], number[]] {
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

export function sameNumbers(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false
  return true
}

export function byLabelThenName(a: GroupEntity, b: GroupEntity): number {
  if (a.label !== b.label) return a.label < b.label ? -1 : 1
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0
}

