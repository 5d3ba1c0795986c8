// Groups that left by removeGroup(), as this thread's picture learnt of them: /metrics shows each
// for DEPARTED_MS more, at lag 0 and in_flight 0, so that a group that lived between two scrapes
// is seen at least once (docs/metrics.md, "A group that left").
import { DepartedSeries } from './snapshot'
import type { TopicEntity } from './entities'

/**
 * How long a departed group stays in /metrics, from when this thread learnt of its removal:
 * Prometheus' lookback. A scraper that scrapes at least that often sees it at least once.
 */
export const DEPARTED_MS = 5 * 60_000
/** At most this many are kept (per thread); past it the oldest go first. ~100 B each. */
export const MAX_DEPARTED = 10_000

interface Departed {
  readonly topic: TopicEntity
  /** The group's label value (its series' `group`). */
  readonly label: string
  /** When this thread's picture replayed the removal (Departures.clock). */
  readonly at: number
}

export class Departures {
  /** @internal Tests move time on; otherwise performance.now() (one thread's clock: the list is that thread's). */
  static clock: () => number = () => performance.now()
  /** Oldest first (removals are replayed in log order, so `at` never decreases along it). */
  #list: Departed[] = []
  #head = 0
  /** The epoch when this thread began to record: a removal at or before it is older than the record. */
  readonly #since: number

  constructor(since: number) {
    this.#since = since
  }

  /**
   * A live group of `topic` labelled `label` was removed with `epoch` (picture.ts, replaying its
   * RemoveGroup entry). One published before recording began is not kept: a thread that replays
   * the log as it starts would otherwise show every group removed since the log's checkpoint.
   */
  add(topic: TopicEntity, label: string, epoch: number): void {
    if (epoch <= this.#since) return
    const at = Departures.clock()
    this.#list.push({ topic, label, at })
    if (this.#list.length - this.#head > MAX_DEPARTED) this.#head++
    this.#forget(at)
  }

  /**
   * The departed groups to show now, one per (topic label, group label), of topics still live
   * (`isLive`); undefined when there are none. Those older than DEPARTED_MS are let go.
   */
  current(isLive: (topic: TopicEntity) => boolean): readonly DepartedSeries[] | undefined {
    this.#forget(Departures.clock())
    const list = this.#list
    if (this.#head === list.length) return undefined
    const seen = new Set<string>()
    const out: DepartedSeries[] = []
    for (let d = this.#head; d < list.length; d++) {
      const { topic, label } = list[d]
      const key = `${topic.label}\u0000${label}`
      if (seen.has(key) || !isLive(topic)) continue
      seen.add(key)
      out.push({ topic: topic.label, group: label })
    }
    return out.length === 0 ? undefined : out
  }

  /** How many are kept (tests). */
  get size(): number {
    return this.#list.length - this.#head
  }

  /**
   * Lets go of those older than DEPARTED_MS at `now` (also as removals come: a thread whose reader
   * is seldom asked keeps only the last minutes'), and cuts the front away once it is half the array.
   */
  #forget(now: number): void {
    const since = now - DEPARTED_MS
    while (this.#head < this.#list.length && this.#list[this.#head].at < since) this.#head++
    if (this.#head >= 64 && this.#head * 2 >= this.#list.length) {
      this.#list = this.#list.slice(this.#head)
      this.#head = 0
    }
  }
}
