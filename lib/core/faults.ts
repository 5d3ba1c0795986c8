// Design §5: a fault is recorded in a bounded log and emitted as a 'fault' event; it never throws.

export interface FaultRecord {
  code: FaultCode
  metric: string
  labels: Record<string, string>
  /**
   * The raw topic (and group) name of a fault about one, as given to `surface.topic()` and
   * `topic.group()`: `labels` has them sanitized, so names that differ only in characters a label
   * cannot hold (`a.b`, `a b`; `注文`) share label values (docs/faults.md).
   */
  names?: FaultNames
  previous: number | null
  attempted: number | null
  at: string
}

export interface FaultNames {
  topic: string
  group?: string
}

/** A fault as every thread's recorder reports it (FaultSink's arguments), stamped now. */
export function faultRecord(code: FaultCode, metric: string, labels: Record<string, string>, previous: number | null, attempted: number | null, names?: FaultNames): FaultRecord {
  return { code, metric, labels, ...(names === undefined ? {} : { names }), previous, attempted, at: new Date().toISOString() }
}

/** Fault codes this library raises (design §4, §5, §6). */
export const FAULT_CODES = [
  'EPOCH_REGRESSION',
  'SEQ_REGRESSION',
  'ACK_FLOOR_INVALID',
  'IN_FLIGHT_UNDERFLOW',
  'DLQ_WITHOUT_DROP',
  'WRITE_WHILE_READ_ONLY',
  'CONNECTIONS_UNDERFLOW',
  'CONSERVATION_BROKEN',
  'SEQ_GAP',
  'SEQ_NOT_APPENDED',
  'ALREADY_SETTLED',
  'ALREADY_IN_FLIGHT',
  'NOT_IN_FLIGHT',
  'SETTLE_WINDOW_EXCEEDED',
  'IN_FLIGHT_LIMIT_PASSED',
  'IN_FLIGHT_EXCEEDS_DEPTH',
] as const

/**
 * A fault record's code: one of FAULT_CODES, or one of the two notes the main thread adds
 * (docs/faults.md). A typo in a comparison (`fault.code === 'ALREADY_SETTLD'`) does not compile.
 */
export type FaultCode = (typeof FAULT_CODES)[number] | 'FAULTS_SUPPRESSED' | 'SCRAPE_THREAD_FAILED'

/** How many recent faults the log keeps; older ones are dropped first (counts are kept). */
export const FAULT_LOG_CAPACITY = 1000

export interface FaultLogView {
  capacity: number
  /** Per code, since the surface was created; never reset. */
  counts: Record<string, number>
  /** Newest last, at most `capacity`. */
  recent: FaultRecord[]
  /** Faults that happened, including those the bounded log no longer holds. */
  total: number
}

export class FaultLog {
  readonly capacity: number
  readonly #counts = new Map<string, number>()
  #recent: FaultRecord[] = []
  #total = 0
  /** What worker threads counted (exact, in shared memory: worker-faults.ts). */
  #workerCounts: () => Map<string, number> = () => new Map()

  constructor(capacity = FAULT_LOG_CAPACITY) {
    this.capacity = capacity
  }

  /** A fault raised in this thread: counted and kept. */
  add(fault: FaultRecord): void {
    this.#counts.set(fault.code, (this.#counts.get(fault.code) ?? 0) + 1)
    this.#total++
    this.note(fault)
  }

  /** A fault counted elsewhere (a worker's), or a summary that is no fault of its own: kept, not counted. */
  note(fault: FaultRecord): void {
    this.#recent.push(fault)
    // Amortised: trim in batches so a fault storm costs O(1) per fault.
    if (this.#recent.length >= this.capacity * 2) this.#recent = this.#recent.slice(-this.capacity)
  }

  /** Where worker threads' counts are read from. */
  countWorkers(counts: () => Map<string, number>): void {
    this.#workerCounts = counts
  }

  get total(): number {
    let total = this.#total
    for (const count of this.#workerCounts().values()) total += count
    return total
  }

  view(): FaultLogView {
    const all = new Map(this.#counts)
    for (const [code, count] of this.#workerCounts()) all.set(code, (all.get(code) ?? 0) + count)
    const counts: Record<string, number> = {}
    for (const code of [...all.keys()].sort()) counts[code] = all.get(code)!
    return { capacity: this.capacity, counts, recent: this.#recent.slice(-this.capacity), total: this.total }
  }
}
