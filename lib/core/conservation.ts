// design §4: the conservation identity, checked at scrape time and as a group leaves
// (Observer.checkLeaving). Per group g of a topic, since g
// was registered:
//
//   residual_g = Δproduced − Δdelivered_g − Δdropped_g − Δdepth_g     (0 for honest accounting)
//
// where depth_g = Σ_p (last_seq_p − ack_floor_{g,p} − settled above the floor) counts every message g
// has not settled (reader.ts; docs/metrics.md). Between a floor-level settlement's ackFloor() and
// its delivered()/dropped() call a busy group shows a transient residual (what the floor passed,
// at most what is in flight), and while a producer in another thread is between its two writes
// any group can (the re-read and the `producing` marker tell that moment). The baseline is the
// group's balance at registration (0, or what `from: 'latest'` skipped), recorded with the group
// itself, so no transient can be frozen into it and no mistake is absorbed. A confirmed non-zero
// residual that no settlement under way explains is a fault (`CONSERVATION_BROKEN`), raised once
// per episode rather than once per scrape: in a quiet window (nothing in flight), at any time for
// a group settled per message, and above in_flight for a floor-level one.
//
// The same check holds in_flight to what the group owes (design §5): every message in flight is
// one it has not settled, so in_flight ≤ depth_g. Only for a group that has no floor ackFloor()
// moved on a partition it does not settle per message (GroupSnapshot.inFlightBounded; entities.ts
// G_FLOOR_MOVED_INT32): a floor-level broker's ackFloor() precedes its delivered() and a worker
// can be caught between them, while a group settled per message moves its floors and in_flight
// together under its lock. A quiet re-read
// (the same numbers, nothing being written) with more in flight than owed is
// `IN_FLIGHT_EXCEEDS_DEPTH`: a message counted in flight twice (dispatch() and send() before the
// group's windows existed, docs/integration.md) or a dispatch() no settlement will ever end (a
// settle() ends only what send() counted), which keeps in_flight from 0 for good and with it the
// identity's quiet window.
import { G_EPISODE, GroupEntity } from './entities'
import { faultRecord, type FaultRecord } from './faults'
import { SLOTS_PER_CHUNK } from './layout'
import type { Memory } from './memory'
import type { Count, GroupSnapshot, Snapshot, TopicSnapshot } from './snapshot'

/** What an episode is of: a bit each, so a group can be in both at once. */
export const enum Episode {
  Broken = 1, // CONSERVATION_BROKEN
  InFlight = 2, // IN_FLIGHT_EXCEEDS_DEPTH
}

/**
 * Where a checker keeps which groups are in a reported episode. `begin` is true for the one caller
 * that starts an episode (it reports it); `end` closes the group's episode, if any.
 */
export interface Episodes {
  begin(group: GroupSnapshot, kind: Episode): boolean
  end(group: GroupSnapshot, kind: Episode): void
  /** The group is in a reported episode of `kind`. */
  open(group: GroupSnapshot, kind: Episode): boolean
}

/** Episodes of one checker alone (tests, a checker without shared memory). */
export class LocalEpisodes implements Episodes {
  readonly #open = new WeakMap<object, number>()
  begin(group: GroupSnapshot, kind: Episode): boolean {
    const bits = this.#open.get(group.key) ?? 0
    if ((bits & kind) !== 0) return false
    this.#open.set(group.key, bits | kind)
    return true
  }
  end(group: GroupSnapshot, kind: Episode): void {
    const bits = this.#open.get(group.key) ?? 0
    if ((bits & kind) !== 0) this.#open.set(group.key, bits & ~kind)
  }
  open(group: GroupSnapshot, kind: Episode): boolean {
    return ((this.#open.get(group.key) ?? 0) & kind) !== 0
  }
}

/**
 * Episodes in the group's shared cell (entities.ts G_EPISODE): the main thread's checker
 * (snapshot(), /stats) and the scrape thread's (/metrics) see one episode, so a broken identity
 * is reported once, whichever thread finds it first. A removed group's block is zeroed before it is
 * reused, so a group registered later starts outside any episode. Callers hold the registration
 * lock, so the group's block is its own while they look.
 */
export class SharedEpisodes implements Episodes {
  readonly #memory: Memory
  constructor(memory: Memory) {
    this.#memory = memory
  }
  begin(group: GroupSnapshot, kind: Episode): boolean {
    const [cells, at] = this.#cell(group)
    // Atomics.or returns the bits before: the one caller that set this kind's bit begins it.
    return (Atomics.or(cells, at, kind) & kind) === 0
  }
  open(group: GroupSnapshot, kind: Episode): boolean {
    const [cells, at] = this.#cell(group)
    return (Atomics.load(cells, at) & kind) !== 0
  }
  end(group: GroupSnapshot, kind: Episode): void {
    const [cells, at] = this.#cell(group)
    if ((Atomics.load(cells, at) & kind) !== 0) Atomics.and(cells, at, ~kind)
  }
  #cell(group: GroupSnapshot): [Int32Array, number] {
    const slot = (group.key as GroupEntity).slot
    return [this.#memory.sharedI32(Math.floor(slot / SLOTS_PER_CHUNK)), ((slot % SLOTS_PER_CHUNK) + G_EPISODE) * 2]
  }
}

export interface ConservationGroup {
  /** Raw group name. */
  group: string
  label: string
  delivered: Count
  dropped: Count
  depth: Count
  /** Δproduced − Δdelivered − Δdropped − Δdepth since the group was registered. */
  residual: number | bigint
  /** The group had nothing in flight and its numbers were stable across a re-read. */
  quiet: boolean
  in_flight: number
  /**
   * design §4: what is in flight is owed. false when a re-read confirmed in_flight > depth (the
   * IN_FLIGHT_EXCEEDS_DEPTH condition); null for a group not checked: one whose floor ackFloor()
   * has moved (such a floor moves before its delivered()).
   */
  in_flight_within_depth: boolean | null
}

export interface ConservationTopic {
  /** Raw topic name. */
  topic: string
  label: string
  produced: Count
  dropped: Count
  dlq: Count
  /** design §4: dlq counts a subset of dropped, so dlq ≤ dropped at all times. */
  dlq_within_dropped: boolean
  groups: ConservationGroup[]
}

export interface ConservationReport {
  topics: ConservationTopic[]
}

/**
 * Episodes a checker outside the main thread finds (the scrape thread's): it does not report them
 * but lists them for the main thread to confirm (lib/core/observer.ts). That thread's own recording
 * calls run to completion between its tasks, so only it can tell a broken identity from one of its
 * batches caught half-way (a settlement's delivered() made, its ackFloor() not yet).
 */
export class SuspectEpisodes extends SharedEpisodes {
  suspects: GroupSnapshot[] = []
  override begin(group: GroupSnapshot, kind: Episode): boolean {
    if (!this.open(group, kind) && this.suspects[this.suspects.length - 1] !== group) this.suspects.push(group)
    return false
  }
}

const BROKEN_METRIC = 'mq_topic_messages_produced_total'

// Below 2^50 each, a balance of four terms stays under 2^52: plain numbers are exact (see residualOf).
const NUMBER_FAST_PATH_LIMIT = 2 ** 50

export class ConservationChecker {
  readonly #onBroken: (fault: FaultRecord) => void
  readonly #episodes: Episodes
  /** Set by #group(): what it found (two results without an object per group and scrape). */
  #residual: number | bigint = 0
  #quiet = false
  #within: boolean | null = null

  constructor(onBroken: (fault: FaultRecord) => void, episodes: Episodes = new LocalEpisodes()) {
    if (typeof onBroken !== 'function') throw new TypeError('ConservationChecker needs an onBroken callback')
    this.#onBroken = onBroken
    this.#episodes = episodes
  }

  /**
   * Checks every group of `snapshot` and raises the faults (the /metrics and /healthz path: no
   * report is built). `reread` takes a fresh snapshot of one topic; it is called (at most once
   * per topic and check) only when a group looks quiet, to tell a broken identity (or a stable
   * baseline) from a producer or consumer that moved between two reads.
   */
  check(snapshot: Snapshot, reread: (topic: TopicSnapshot) => TopicSnapshot): void {
    const topics = snapshot.topics
    for (let t = 0; t < topics.length; t++) {
      const topic = topics[t]
      let fresh: TopicSnapshot | undefined
      for (let g = 0; g < topic.groups.length; g++) fresh = this.#group(topic, topic.groups[g], fresh, reread)
    }
  }

  /** The same check, and the report `/stats?filter=conservation` shows. */
  report(snapshot: Snapshot, reread: (topic: TopicSnapshot) => TopicSnapshot): ConservationReport {
    const topics: ConservationTopic[] = []
    for (const topic of snapshot.topics) {
      let fresh: TopicSnapshot | undefined
      const groups: ConservationGroup[] = []
      for (const group of topic.groups) {
        fresh = this.#group(topic, group, fresh, reread)
        groups.push({
          group: group.name,
          label: group.label,
          delivered: group.delivered,
          dropped: group.dropped,
          depth: group.depth,
          residual: this.#residual,
          quiet: this.#quiet,
          in_flight: group.inFlight,
          in_flight_within_depth: this.#within,
        })
      }
      topics.push({
        topic: topic.name,
        label: topic.label,
        produced: topic.produced,
        dropped: topic.dropped,
        dlq: topic.dlq,
        dlq_within_dropped: topic.dlq <= topic.dropped, // mixed number/bigint comparison is exact
        groups,
      })
    }
    return { topics }
  }

  /**
   * One group: computes its residual against its balance at registration, raises
   * CONSERVATION_BROKEN once per episode; checks in_flight ≤ depth. Leaves the residual, the quiet
   * flag and the bound's verdict in #residual, #quiet and #within; returns the topic's re-read, if one was taken (shared by the topic's groups).
   */
  #group(
    topic: TopicSnapshot,
    group: GroupSnapshot,
    fresh: TopicSnapshot | undefined,
    reread: (topic: TopicSnapshot) => TopicSnapshot,
  ): TopicSnapshot | undefined {
    let quiet = group.inFlight === 0
    // The baseline is the balance recorded at registration (the identity is linear, so one number:
    // produced − delivered − dropped − depth then), not at the first scrape: a mistake made before
    // any scrape shows too.
    const residual = residualOf(group.start, topic.produced, group)
    if (residual === 0 || residual === 0n) {
      // The episode, if any, is over once a re-read confirms it (the same numbers, nothing being
      // written): a read torn by a producer between its two writes can show 0 for a residual that
      // is still there, and ending the episode on it would report one mistake again. Such tears
      // are not rare: a read takes last_seq before produced, so an append between them shows
      // produced one ahead, unmarked, and a mistake of −1 reads 0 (two such reads in a row too).
      // The price: on a topic that never stands still the episode stays open until it does, and a
      // later mistake of the group meanwhile is one with it (docs/metrics.md).
      if (this.#episodes.open(group, Episode.Broken)) {
        fresh ??= reread(topic)
        if (sameNumbers(topic, group, fresh)) this.#episodes.end(group, Episode.Broken)
        else quiet = false
      }
    } else if (quiet || group.settledPerMessage || !transient(residual, group.inFlight)) {
      // Judged on numbers a re-read confirms: in a quiet window; at any time for a group settled
      // per message (its calls leave no transient outside its lock, which `producing` shows, so a
      // busy group, never without something in flight, is checked too); and for a floor-level
      // group with something in flight, when the residual is above what a settlement under way
      // can leave (its floor moved first: what the floor passed, at most what is in flight). A
      // floor-level settlement counted before its floor moves leaves a negative transient of any
      // size, so a negative residual waits for a quiet window.
      fresh ??= reread(topic)
      if (sameNumbers(topic, group, fresh)) {
        if (this.#episodes.begin(group, Episode.Broken)) this.#onBroken(brokenFault(topic, group, residual))
      } else {
        quiet = false // something moved between the two reads: not a quiet window
      }
    }
    // in_flight ≤ depth, judged only on numbers a re-read confirms (a busy moment can show either
    // side of it). The episode ends when nothing is in flight: until then a count stuck above what
    // is owed is one episode, however often a backlog hides it.
    let within: boolean | null = null
    if (group.inFlightBounded) {
      const over = group.inFlight > group.depth
      within = true
      if (over || (group.inFlight === 0 && this.#episodes.open(group, Episode.InFlight))) {
        fresh ??= reread(topic)
        if (sameNumbers(topic, group, fresh)) {
          within = !over
          if (!over) this.#episodes.end(group, Episode.InFlight)
          else if (this.#episodes.begin(group, Episode.InFlight)) this.#onBroken(overFault(topic, group))
        }
      }
    }
    this.#within = within
    this.#residual = residual
    this.#quiet = quiet
    return fresh
  }
}

/**
 * Whether a floor-level group's residual can be a settlement under way (docs/metrics.md): its
 * floor moved first (depth down by what it passed) and its delivered()/dropped() not yet made (in
 * flight not yet lowered): residual ≤ in_flight; or counted first, its floor not yet moved: below 0.
 */
function transient(residual: number | bigint, inFlight: number): boolean {
  return residual <= inFlight // mixed number/bigint comparison is exact
}

/** produced − delivered − dropped − depth, exact; a number unless it leaves the safe range. */
function balanceOf(produced: Count, group: GroupSnapshot): number | bigint {
  const { delivered, dropped, depth } = group
  if (isSmall(produced) && isSmall(delivered) && isSmall(dropped) && isSmall(depth)) return produced - delivered - dropped - depth
  return safe(BigInt(produced) - BigInt(delivered) - BigInt(dropped) - BigInt(depth))
}

/** Δproduced − Δdelivered − Δdropped − Δdepth since the baseline, exact. */
function residualOf(base: number | bigint, produced: Count, group: GroupSnapshot): number | bigint {
  const balance = balanceOf(produced, group)
  // Each balance of four terms below 2^50 is below 2^52 in size: their difference is exact.
  if (typeof balance === 'number' && typeof base === 'number' && Math.abs(balance) < 2 ** 52 && Math.abs(base) < 2 ** 52) return balance - base
  return safe(BigInt(balance) - BigInt(base))
}

function safe(value: bigint): number | bigint {
  const limit = BigInt(Number.MAX_SAFE_INTEGER)
  return value <= limit && value >= -limit ? Number(value) : value
}

function isSmall(value: Count): value is number {
  return typeof value === 'number' && value < NUMBER_FAST_PATH_LIMIT
}

/**
 * The re-read shows the same numbers for this group, in_flight included (for the identity, 0 in
 * both), and still settled per message if it was.
 */
function sameNumbers(topic: TopicSnapshot, group: GroupSnapshot, fresh: TopicSnapshot): boolean {
  // A producer stopped between its counter and last_seq writes, or a thread stopped inside a
  // group's locked send/settle, leaves the same torn numbers for both reads: the writing marker
  // (`producing`: a producer's marker, or a group's lock held, after either read) tells such a
  // moment from a quiet one.
  if (fresh.key !== topic.key || topic.producing === true || fresh.producing === true || !countEquals(fresh.produced, topic.produced)) return false
  const again = fresh.groups.find((g) => g.key === group.key)
  return (
    again !== undefined &&
    again.inFlight === group.inFlight &&
    again.settledPerMessage === group.settledPerMessage &&
    again.inFlightBounded === group.inFlightBounded &&
    countEquals(again.delivered, group.delivered) &&
    countEquals(again.dropped, group.dropped) &&
    again.depth === group.depth
  )
}

function countEquals(a: Count, b: Count): boolean {
  return typeof a === typeof b ? a === b : BigInt(a) === BigInt(b)
}

function brokenFault(topic: TopicSnapshot, group: GroupSnapshot, residual: number | bigint): FaultRecord {
  // previous: what produced should be given the consumption side; attempted: what it is.
  const actual = BigInt(topic.produced)
  const expected = actual - BigInt(residual)
  return faultRecord('CONSERVATION_BROKEN', BROKEN_METRIC, { topic: topic.label, group: group.label }, Number(expected), Number(actual), { topic: topic.name, group: group.name })
}

function overFault(topic: TopicSnapshot, group: GroupSnapshot): FaultRecord {
  // previous: the most that can be in flight (what the group owes); attempted: what in_flight says.
  // in_flight (below 2^31) is above the depth: the depth is below 2^53
  return faultRecord('IN_FLIGHT_EXCEEDS_DEPTH', 'mq_group_in_flight', { topic: topic.label, group: group.label }, Number(group.depth), group.inFlight, { topic: topic.name, group: group.name })
}
