// SPEC §5: a fault is recorded in a bounded log and emitted as a 'fault' event; it never throws.
import type { FaultRecord } from './registry'

export type { FaultRecord }

/** Fault codes this library raises (SPEC §4, §5, §6). */
export const FAULT_CODES = [
  'EPOCH_REGRESSION',
  'SEQ_REGRESSION',
  'ACK_FLOOR_INVALID',
  'IN_FLIGHT_UNDERFLOW',
  'DLQ_WITHOUT_DROP',
  'WRITE_WHILE_READ_ONLY',
  'CONNECTIONS_UNDERFLOW',
  'CONSERVATION_BROKEN',
] as const

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

  constructor(capacity = FAULT_LOG_CAPACITY) {
    this.capacity = capacity
  }

  add(fault: FaultRecord): void {
    this.#counts.set(fault.code, (this.#counts.get(fault.code) ?? 0) + 1)
    this.#total++
    this.#recent.push(fault)
    // Amortised: trim in batches so a fault storm costs O(1) per fault.
    if (this.#recent.length >= this.capacity * 2) this.#recent = this.#recent.slice(-this.capacity)
  }

  /** Count a fault whose details were not kept (a worker's fault past its queue bound). */
  count(code: string): void {
    this.#counts.set(code, (this.#counts.get(code) ?? 0) + 1)
    this.#total++
  }

  get total(): number {
    return this.#total
  }

  view(): FaultLogView {
    const counts: Record<string, number> = {}
    for (const code of [...this.#counts.keys()].sort()) counts[code] = this.#counts.get(code)!
    return { capacity: this.capacity, counts, recent: this.#recent.slice(-this.capacity), total: this.#total }
  }
}
