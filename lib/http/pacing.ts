// A scraper that asks for /metrics back to back must not take the broker's CPU. The
// scrape work of one surface on the main thread — snapshot, conservation check, render,
// compression — is paced by a token bucket kept in milliseconds of the main thread's time: it
// fills at `share` ms per ms of wall-clock time up to `burstMs`, and a slice of scrape work runs
// only while the bucket is not in debt (then takes what the slice took, into debt if need be). A
// scrape now and then (Prometheus every 15 s) finds the bucket full and runs at full speed;
// scrapes back to back settle at `share` of the main thread, and the rest of the time is the
// broker's. ScrapeScheduler (below) runs a surface's scrapes one at a time through its pacer.
//
// Slices are timed by the wall clock, not by CPU time: on a busy machine a slice's wall time also
// counts the moments the scheduler gave its core to another thread, so the pacing errs towards the
// broker.
import { MqMetricsError } from '../core/errors'

export class ScrapePacer {
  readonly share: number
  readonly burstMs: number
  readonly #now: () => number
  #tokens: number
  #at: number

  constructor(share: number, burstMs: number, now: () => number = () => performance.now()) {
    if (!(share > 0 && share <= 1)) throw new RangeError(`share must be in (0, 1], got ${share}`)
    if (!(burstMs >= 0 && Number.isFinite(burstMs))) throw new RangeError(`burstMs must be a finite number ≥ 0, got ${burstMs}`)
    this.share = share
    this.burstMs = burstMs
    this.#now = now
    this.#tokens = burstMs
    this.#at = now()
  }

  /** The bucket's content at `now`: refilled since the last reading, never above the burst. */
  #level(now: number): number {
    return Math.min(this.burstMs, this.#tokens + (now - this.#at) * this.share)
  }

  /** How many ms to wait before the next slice may run: 0 when it may run now. */
  delay(): number {
    const now = this.#now()
    this.#tokens = this.#level(now)
    this.#at = now
    return this.#tokens >= 0 ? 0 : Math.max(1, Math.ceil(-this.#tokens / this.share))
  }

  /** A slice ran for `ms`. */
  spend(ms: number): void {
    this.#tokens -= ms
  }

  /** The bucket's content now, in ms (negative: in debt). For tests and diagnostics. */
  get tokens(): number {
    return this.#level(this.#now())
  }
}

/** What a scrape's promise rejects with when its client went away before its turn: it was never started. */
export class ScrapeAbandoned extends MqMetricsError {
  declare readonly code: 'SCRAPE_ABANDONED'
  constructor() {
    super('SCRAPE_ABANDONED', 'the client went away before its scrape began')
    this.name = 'ScrapeAbandoned'
  }
}

/** A scrape in progress: advanced by `step(deadline)` until it returns true. */
export interface SteppedJob {
  step(deadline: number): boolean
}

/**
 * Runs the scrapes of one surface one at a time, in order of arrival, in slices of `sliceMs`
 * paced by `pacer`. One job at a time bounds the memory of concurrent scrapers (one snapshot and
 * one body under way, however many clients wait) and gives each scrape the state as of its own
 * start: a scrape that arrives while another is under way begins once that one has produced its
 * body. A scrape that finds nothing under way and the bucket in credit runs its first slice inside
 * the call; if that finishes it, the answer is returned as is, without a promise.
 */
export class ScrapeScheduler {
  readonly pacer: ScrapePacer
  readonly #sliceMs: number
  /** A job has been started (or handed its turn) and has not finished. */
  #busy = false
  readonly #queue: Array<{ start: () => void; pending: Pending }> = []
  /** Every scrape not answered yet (under way or waiting), with the timer or immediate it waits on. */
  readonly #pending = new Set<Pending>()
  /** close()'s error: every scrape after it is refused with it. */
  #closed: Error | undefined

  constructor(pacer: ScrapePacer, sliceMs: number) {
    this.pacer = pacer
    this.#sliceMs = sliceMs
  }

  /** Scrapes waiting for their turn (not counting the one under way). */
  get waiting(): number {
    return this.#queue.length
  }

  /**
   * `begin()` starts the job (the snapshot, in its first slice); `take(job)` gives the answer once
   * it is done. `abandoned()`, when given, is asked when a waiting scrape's turn comes: true (its
   * client went away) and the scrape is skipped — never started, rejected with ScrapeAbandoned —
   * so that requests nobody waits for any more cost no snapshot and no render.
   */
  run<J extends SteppedJob, T>(begin: () => J, take: (job: J) => T, abandoned?: () => boolean): T | Promise<T> {
    if (this.#closed !== undefined) throw this.#closed
    const state: { begin: () => J; job: J | undefined } = { begin, job: undefined }
    if (!this.#busy && this.#queue.length === 0 && this.pacer.delay() === 0) {
      this.#busy = true
      let done: boolean
      try {
        done = this.#slice(state)
      } catch (error) {
        this.#release()
        throw error
      }
      if (done) {
        this.#release()
        return take(state.job!)
      }
      return new Promise((resolve, reject) => {
        const pending = this.#track(reject)
        pending.wait = setImmediate(this.#stepper(state, take, resolve, pending, abandoned))
      })
    }
    return new Promise((resolve, reject) => {
      const pending = this.#track(reject)
      this.#queue.push({ start: this.#stepper(state, take, resolve, pending, abandoned), pending })
      this.#next()
    })
  }

  /**
   * The surface is closed: every scrape under way or waiting is rejected with `error` now (its
   * request answered 503, not a body of a closed surface's numbers seconds later), its timer
   * cleared, and every later run() throws it. Nothing of the scheduler's runs after it.
   */
  close(error: Error): void {
    this.#closed = error
    this.#queue.length = 0
    for (const pending of this.#pending) {
      pending.done = true
      if (pending.wait !== undefined) (clearTimeout(pending.wait as NodeJS.Timeout), clearImmediate(pending.wait as NodeJS.Immediate))
      pending.reject(error)
    }
    this.#pending.clear()
  }

  #track(reject: (error: unknown) => void): Pending {
    const pending: Pending = { reject, wait: undefined, done: false }
    this.#pending.add(pending)
    return pending
  }

  /** One slice of `state`'s job (starting it first if need be), charged to the pacer; true once done. */
  #slice<J extends SteppedJob>(state: { begin: () => J; job: J | undefined }): boolean {
    const started = performance.now()
    try {
      state.job ??= state.begin()
      return state.job.step(started + this.#sliceMs)
    } finally {
      this.pacer.spend(performance.now() - started)
    }
  }

  /** The loop of one job that holds the turn: wait for the pacer, slice, yield; then answer and pass the turn on. */
  #stepper<J extends SteppedJob, T>(
    state: { begin: () => J; job: J | undefined }, take: (job: J) => T,
    resolve: (value: T) => void, pending: Pending, abandoned?: () => boolean,
  ): () => void {
    const step = (): void => {
      pending.wait = undefined
      if (pending.done) return // closed meanwhile: rejected already
      let result: T
      try {
        if (state.job === undefined && abandoned?.() === true) throw new ScrapeAbandoned()
        const wait = this.pacer.delay()
        if (wait > 0) {
          pending.wait = setTimeout(step, wait)
          return
        }
        if (!this.#slice(state)) {
          pending.wait = setImmediate(step)
          return
        }
        result = take(state.job!)
      } catch (error) {
        this.#finish(pending)
        pending.reject(error)
        return
      }
      this.#finish(pending)
      resolve(result)
    }
    return step
  }

  /** `pending`'s scrape is answered: it leaves the set, and the next in line gets the turn. */
  #finish(pending: Pending): void {
    pending.done = true
    this.#pending.delete(pending)
    this.#release()
  }

  /** The job under way is finished: the next in line gets the turn. */
  #release(): void {
    this.#busy = false
    this.#next()
  }

  /** Hands the turn to the first waiting job, on a later turn of the event loop (never inside another job's answer). */
  #next(): void {
    if (this.#busy || this.#closed !== undefined) return
    const first = this.#queue.shift()
    if (first === undefined) return
    this.#busy = true
    first.pending.wait = setImmediate(first.start)
  }
}

/** A scrape not answered yet: how to refuse it, and what it waits on (cleared by close()). */
interface Pending {
  reject: (error: unknown) => void
  wait: NodeJS.Timeout | NodeJS.Immediate | undefined
  done: boolean
}
