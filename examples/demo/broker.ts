// The data path of the simulated broker behind `npm start` (design §13), shared by the demo's main
// thread and its worker thread. It records through the public API only, as a real broker would:
// a producer appends to partitions, and two consumer groups per topic dispatch, retry, drop and
// dead-letter messages, keeping honest books so that the conservation identity (design §4) holds.
//
// Honest books, concretely: each group consumes each partition as an ordered queue. The head
// message (ackFloor + 1) is attempted until it is delivered or dropped, and a retry holds back the
// messages behind it. So a group's ack floor is always exactly its highest settled seq, and
//   Σ_p ackFloor_{g,p} = delivered_g + dropped_g
// at every moment between two calls. Each settlement calls `ackFloor` first and only then
// `delivered()`/`dropped()`: the message is still in flight while its floor moves, so the group
// is never seen quiet (in_flight 0) with a settlement half recorded.
import type { Group, Topic } from 'mq-metrics'

/** What the simulation records through: the surface on the main thread, a recorder in a worker. */
export interface DemoRecorder {
  topic(name: string): Topic
  readonly latency: { record(ms: number): void }
}

export interface SimulationOptions {
  /** Partitions per topic. */
  partitions: number
  /** design §8 max_attempts: the attempt that fails for the max_attempts-th time drops the message. */
  maxAttempts: number
  /** The tick length, in milliseconds (rates are per second). */
  tickMs: number
}

/** The two consumer groups of every topic: a fast one, and a slower one with a tight in-flight bound. */
export const DEMO_GROUPS = [
  { name: 'processor', maxInFlight: undefined, prefetch: 64, speed: 2.0 },
  { name: 'archiver', maxInFlight: 100, prefetch: 32, speed: 1.4 },
] as const

// Simulated failure model. A poison message fails every attempt (so it is dropped after
// max_attempts); any other attempt fails transiently now and then; a DLQ write fails sometimes.
const POISON_RATE = 0.005
const TRANSIENT_FAILURE_RATE = 0.03
const DLQ_FAILURE_RATE = 0.1
/** A failed attempt k is retried k ticks later (linear back-off). */
const RETRY_BACKOFF_TICKS = 1
const MESSAGE_BYTES_MIN = 200
const MESSAGE_BYTES_SPREAD = 1000
/** Mean simulated handler time added to queueing time in the publish-to-ack latency, ms. */
const MEAN_HANDLER_MS = 2

/** Totals one thread's simulation has recorded (for the live summary and the final report). */
export interface SimulationTotals {
  produced: number
  delivered: number
  dropped: number
  dlq: number
  dlqFailures: number
  retries: number
  /** Produce attempts refused: admission said read_only, or produced() returned false. */
  refused: number
  /** Dispatches refused by max_in_flight (the consumer waited). */
  dispatchRefused: number
}

export function emptyTotals(): SimulationTotals {
  return { produced: 0, delivered: 0, dropped: 0, dlq: 0, dlqFailures: 0, retries: 0, refused: 0, dispatchRefused: 0 }
}

export function addTotals(into: SimulationTotals, from: SimulationTotals): SimulationTotals {
  for (const key of Object.keys(into) as (keyof SimulationTotals)[]) into[key] += from[key]
  return into
}

/** One partition as the broker's log sees it: the last seq, and when each message was appended. */
class PartitionLog {
  lastSeq = 0
  /** appendedAt[seq − 1 − trimmed]: the append time of each message still unsettled by some group. */
  appendedAt: number[] = []
  trimmed = 0

  appendTime(seq: number): number {
    return this.appendedAt[seq - 1 - this.trimmed]
  }

  /** Forgets append times every group has settled past (keeps memory flat on long runs). */
  trim(lowestFloor: number): void {
    const settled = lowestFloor - this.trimmed
    if (settled >= 4096) {
      this.appendedAt.splice(0, settled)
      this.trimmed = lowestFloor
    }
  }
}

/** One group's ordered queue on one partition. */
class Lane {
  /** Highest settled seq; every seq up to it is delivered or dropped. */
  floor = 0
  /** Highest dispatched seq; (floor, dispatched] are in flight. */
  dispatched = 0
  /** Attempts made on the head message (floor + 1). */
  attempts = 0
  headIsPoison = false
  /** The tick at which the head may be attempted again. */
  retryAtTick = 0
  /** Attempts this consumer may still make: fractional rates, and catching up after a retry. */
  budget = 0
}

class ConsumerGroup {
  readonly handle: Group
  readonly prefetch: number
  readonly speed: number
  readonly lanes: Lane[]
  /** Where the next dispatch round starts, so no partition starves at max_in_flight. */
  nextLane = 0

  constructor(handle: Group, prefetch: number, speed: number, partitions: number) {
    this.handle = handle
    this.prefetch = prefetch
    this.speed = speed
    this.lanes = Array.from({ length: partitions }, () => new Lane())
  }
}

/** A topic of the simulated broker: its producer and its two consumer groups. */
export class SimulatedTopic {
  readonly name: string
  readonly totals = emptyTotals()
  readonly #topic: Topic
  readonly #latency: { record(ms: number): void }
  readonly #options: SimulationOptions
  readonly #logs: PartitionLog[]
  readonly #groups: ConsumerGroup[]
  #produceBudget = 0
  #tick = 0
  #lastTickAt: number | undefined
  #nextPartition = 0

  constructor(recorder: DemoRecorder, name: string, options: SimulationOptions) {
    this.name = name
    this.#options = options
    this.#latency = recorder.latency
    this.#topic = recorder.topic(name)
    this.#logs = Array.from({ length: options.partitions }, () => new PartitionLog())
    this.#groups = DEMO_GROUPS.map((spec) => {
      const handle = spec.maxInFlight === undefined ? this.#topic.group(spec.name) : this.#topic.group(spec.name, { max_in_flight: spec.maxInFlight })
      // design §4: floor 0 (nothing settled yet) is an honest floor; it makes every partition's
      // series appear from the first scrape.
      for (let p = 0; p < options.partitions; p++) handle.ackFloor(p, 0)
      return new ConsumerGroup(handle, spec.prefetch, spec.speed, options.partitions)
    })
  }

  /**
   * One tick: consumers settle what was dispatched earlier, the producer appends (when `produce`
   * and the quorum admits writes), and consumers dispatch what is new. `ratePerSecond` is this
   * topic's share of the producer rate; consumers run faster than that so they keep up.
   */
  tick(now: number, ratePerSecond: number, produce: boolean, admitWrite: () => boolean): void {
    this.#tick++
    // Rates follow the clock, not the nominal tick: timers fire late under load.
    const elapsed = this.#lastTickAt === undefined ? this.#options.tickMs : Math.min(now - this.#lastTickAt, 10 * this.#options.tickMs)
    this.#lastTickAt = now
    const perTick = (ratePerSecond * elapsed) / 1000
    for (const group of this.#groups) this.#consume(group, now, perTick)
    if (produce) this.#produce(now, perTick, admitWrite)
    else this.#produceBudget = 0
    for (const group of this.#groups) this.#dispatch(group)
    if (this.#tick % 100 === 0) this.#trimLogs()
  }

  /** Every group has settled every appended message (nothing in flight, depth 0). */
  drained(): boolean {
    for (const group of this.#groups) {
      for (let p = 0; p < this.#logs.length; p++) if (group.lanes[p].floor !== this.#logs[p].lastSeq) return false
    }
    return true
  }

  /** Messages the groups still have to settle, summed over groups and partitions. */
  backlog(): number {
    let backlog = 0
    for (const group of this.#groups) for (let p = 0; p < this.#logs.length; p++) backlog += this.#logs[p].lastSeq - group.lanes[p].floor
    return backlog
  }

  #produce(now: number, perTick: number, admitWrite: () => boolean): void {
    // Producers that cannot write do not pile up a burst for later: the budget is capped.
    this.#produceBudget = Math.min(this.#produceBudget + perTick, perTick * 4 + 1)
    let messages = Math.floor(this.#produceBudget)
    if (messages === 0) return
    if (!admitWrite()) {
      // design §6: READ_ONLY_DEGRADED — the write is not appended; the producer backs off.
      this.totals.refused += messages
      this.#produceBudget = 0
      return
    }
    this.#produceBudget -= messages
    // Small batches: one produced() per partition per tick, seq = the batch's last message.
    const partitions = this.#logs.length
    const counts = new Array<number>(partitions).fill(0)
    while (messages-- > 0) {
      counts[this.#nextPartition]++
      this.#nextPartition = (this.#nextPartition + 1) % partitions
    }
    for (let p = 0; p < partitions; p++) {
      const count = counts[p]
      if (count === 0) continue
      const log = this.#logs[p]
      let bytes = 0
      for (let i = 0; i < count; i++) bytes += MESSAGE_BYTES_MIN + Math.floor(Math.random() * MESSAGE_BYTES_SPREAD)
      const seq = log.lastSeq + count
      if (!this.#topic.produced(p, seq, bytes, count)) {
        // Refused (read_only reached this thread before the producer learned of it): nothing
        // was appended, so the seq does not advance; the producer retries later.
        this.totals.refused += count
        continue
      }
      log.lastSeq = seq
      for (let i = 0; i < count; i++) log.appendedAt.push(now)
      this.totals.produced += count
    }
  }

  #dispatch(group: ConsumerGroup): void {
    const partitions = this.#logs.length
    const first = group.nextLane
    group.nextLane = (first + 1) % partitions
    for (let i = 0; i < partitions; i++) {
      const p = (first + i) % partitions
      const lane = group.lanes[p]
      const lastSeq = this.#logs[p].lastSeq
      while (lane.dispatched < lastSeq && lane.dispatched - lane.floor < group.prefetch) {
        // design §5: dispatch is refused at max_in_flight; the consumer waits for acks.
        if (!group.handle.dispatch(1)) {
          this.totals.dispatchRefused++
          return
        }
        lane.dispatched++
      }
    }
  }

  #consume(group: ConsumerGroup, now: number, perTick: number): void {
    const maxAttempts = this.#options.maxAttempts
    const partitions = this.#logs.length
    // A consumer handles `speed` × the producer rate, and at least one message every other tick
    // (so a drain finishes). Attempts a held-back lane could not make carry over for a while, so
    // it catches up after a retry.
    const perLane = Math.max(perTick / partitions, 0.5) * group.speed
    const carry = Math.max(group.prefetch, perLane * 20)
    for (let p = 0; p < partitions; p++) {
      const lane = group.lanes[p]
      const log = this.#logs[p]
      lane.budget = Math.min(lane.budget + perLane, carry)
      while (lane.budget >= 1 && lane.floor < lane.dispatched && lane.retryAtTick <= this.#tick) {
        lane.budget--
        if (lane.attempts === 0) lane.headIsPoison = Math.random() < POISON_RATE
        lane.attempts++
        const failed = lane.headIsPoison || Math.random() < TRANSIENT_FAILURE_RATE
        if (failed && lane.attempts < maxAttempts) {
          // Redelivered later; the message stays in flight and holds back the partition.
          group.handle.redelivered(1)
          this.totals.retries++
          lane.retryAtTick = this.#tick + lane.attempts * RETRY_BACKOFF_TICKS
          break
        }
        const seq = lane.floor + 1
        lane.floor = seq
        lane.attempts = 0
        lane.retryAtTick = 0
        // design §4 ordering: the floor moves while the message is still in flight, then the
        // settlement (which decrements in_flight) is counted.
        group.handle.ackFloor(p, seq)
        if (!failed) {
          group.handle.delivered(1)
          this.totals.delivered++
          this.#latency.record(now - log.appendTime(seq) + handlerTime())
        } else {
          group.handle.dropped(1)
          this.totals.dropped++
          // After a drop the broker writes the message to the DLQ; that write fails sometimes.
          if (Math.random() >= DLQ_FAILURE_RATE) {
            group.handle.deadLettered(1)
            this.totals.dlq++
          } else {
            this.totals.dlqFailures++
          }
        }
      }
    }
  }

  #trimLogs(): void {
    for (let p = 0; p < this.#logs.length; p++) {
      let lowest = Infinity
      for (const group of this.#groups) lowest = Math.min(lowest, group.lanes[p].floor)
      this.#logs[p].trim(lowest)
    }
  }
}

/** Simulated handler time: exponential, so the latency distribution has a realistic tail. */
function handlerTime(): number {
  return -Math.log(1 - Math.random()) * MEAN_HANDLER_MS
}
