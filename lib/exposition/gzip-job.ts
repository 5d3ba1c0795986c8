// The gzip render of /metrics: topics go in chunks of CHUNK_TOPICS, each family's lines of a chunk
// one deflate fragment (lib/exposition/gzip.ts); a chunk whose numbers and labels are what they
// were at the previous gzip render is neither rendered nor compressed again.
import { Count, Snapshot } from '../core/snapshot'
import { TopicSeries } from './merge'
import { EMPTY_FRAGMENT, Fragment, GzipBody, MemberBuilder, PackedFragments, fragment, pack } from './gzip'
import { FIRST_TOPIC_STAGE, Structure, TOPIC_STAGES, TopicText, Writer, headerOf, writeLatency, writePreamble, writeTopics } from './text'

/** What the gzip job needs of the plain renderer: a sliced render of the whole body (the bulk path). */
export interface PlainRenderer {
  begin(snapshot: Snapshot): PlainJob
}
/** A sliced plain render (RenderJob in render.ts). */
export interface PlainJob {
  step(deadline: number): boolean
  body(): Buffer
}

/** Topics per chunk: ~1,400 samples at 16 partitions × 2 groups; ~80 KB of text. */
export const CHUNK_TOPICS = 32

/**
 * What one chunk's fragments were rendered from: the topics' texts (same object ⇒ same topic key,
 * label and group labels), partition numbers and every number a line shows.
 */
export interface Chunk {
  readonly texts: readonly TopicText[]
  readonly partitions: readonly (readonly number[])[]
  /** Int32Array when every value is an int32 (the common case: half the memory), else Float64Array. */
  readonly values: Int32Array | Float64Array
  /** One per per-topic stage, in render order; none yet for a chunk last seen in a bulk render. */
  readonly fragments: PackedFragments | undefined
}

/** Every number the lines of topics [from, to) show, in a fixed order; NaN for a bigint; −1 for a retries line left out. */
function valuesOf(topics: readonly TopicSeries[], from: number, to: number): Int32Array | Float64Array {
  let count = 0
  for (let t = from; t < to; t++) count += 5 + 2 * topics[t].partitionNumbers.length + 3 * topics[t].groups.length
  const values = new Float64Array(count)
  let i = 0
  for (let t = from; t < to; t++) {
    const topic = topics[t]
    values[i++] = numeric(topic.produced)
    values[i++] = numeric(topic.delivered)
    values[i++] = numeric(topic.dropped)
    values[i++] = numeric(topic.dlq)
    values[i++] = numeric(topic.bytes)
    const { lastSeq, depth, groups } = topic
    const left = topic.groupLeft === true
    for (let p = 0; p < lastSeq.length; p++) values[i++] = numeric(lastSeq[p])
    for (let p = 0; p < depth.length; p++) values[i++] = numeric(depth[p])
    for (let g = 0; g < groups.length; g++) {
      values[i++] = numeric(groups[g].lag)
      values[i++] = numeric(groups[g].inFlight)
      values[i++] = left ? -1 : numeric(groups[g].retries) // no line: never a count
    }
  }
  for (let k = 0; k < values.length; k++) if ((values[k] | 0) !== values[k] || Object.is(values[k], -0)) return values
  return Int32Array.from(values)
}

/** NaN never equals anything: a bigint value makes its chunk render afresh every time. */
function numeric(value: Count): number {
  return typeof value === 'number' ? value : NaN
}

/** The chunk was made from exactly these texts, partitions and numbers (in valuesOf's order). */
function isCurrent(chunk: Chunk, topics: readonly TopicSeries[], texts: readonly TopicText[], from: number, to: number): boolean {
  if (chunk.texts.length !== to - from) return false
  const values = chunk.values
  let i = 0
  for (let t = from; t < to; t++) {
    const topic = topics[t]
    if (chunk.texts[t - from] !== texts[t] || !samePartitions(chunk.partitions[t - from], topic.partitionNumbers)) return false
    // The partition and group counts match (same partitions, same text ⇒ same group labels).
    if (values[i] !== topic.produced || values[i + 1] !== topic.delivered || values[i + 2] !== topic.dropped ||
      values[i + 3] !== topic.dlq || values[i + 4] !== topic.bytes) return false
    i += 5
    const { lastSeq, depth, groups } = topic
    const left = topic.groupLeft === true
    for (let p = 0; p < lastSeq.length; p++) if (values[i++] !== lastSeq[p]) return false
    for (let p = 0; p < depth.length; p++) if (values[i++] !== depth[p]) return false
    for (let g = 0; g < groups.length; g++) {
      const group = groups[g]
      if (values[i] !== group.lag || values[i + 1] !== group.inFlight || values[i + 2] !== (left ? -1 : group.retries)) return false
      i += 3
    }
  }
  return true
}

function samePartitions(a: readonly number[], b: readonly number[]): boolean {
  if (a === b) return true
  if (a.length !== b.length) return false
  for (let p = 0; p < a.length; p++) if (a[p] !== b[p]) return false
  return true
}

/** Family headers never change: compressed once. */
let headerFragments: PackedFragments | undefined
function familyHeaders(): PackedFragments {
  headerFragments ??= pack(Array.from({ length: TOPIC_STAGES }, (_, k) => fragment(headerOf(FIRST_TOPIC_STAGE + k))))
  return headerFragments
}

/** Past this share of changed chunks, a gzip render is one plain body compressed whole. */
const BULK_SHARE = 0.25

/** Per chunk of topics (by index in the render order): what its fragments were made from. */
export class ChunkCache {
  readonly counts = { reused: 0, rendered: 0, bulk: 0 }
  readonly #chunks: (Chunk | undefined)[] = []
  /** Renders one family of one chunk at a time, for compression (no yield while it is in use). */
  readonly #scratch = new Writer(Buffer.allocUnsafeSlow(64 * 1024))

  /** The cached chunk `c` if it holds these topics' numbers and texts (with fragments or not yet). */
  find(c: number, topics: readonly TopicSeries[], texts: readonly TopicText[]): Chunk | undefined {
    const cached = this.#chunks[c]
    const from = c * CHUNK_TOPICS
    return cached !== undefined && isCurrent(cached, topics, texts, from, Math.min(topics.length, from + CHUNK_TOPICS)) ? cached : undefined
  }

  /**
   * Chunk `c` with fragments: `found` (what find() returned, held by the job: the cache itself may
   * have moved on since, to another job's snapshot) if it has them, else compressed now.
   */
  compressed(c: number, topics: readonly TopicSeries[], texts: readonly TopicText[], found: Chunk | undefined): Chunk {
    if (found?.fragments !== undefined) {
      this.counts.reused++
      return found
    }
    this.counts.rendered++
    const from = c * CHUNK_TOPICS
    const to = Math.min(topics.length, from + CHUNK_TOPICS)
    const w = this.#scratch
    const fragments: Fragment[] = new Array(TOPIC_STAGES)
    for (let s = 0; s < TOPIC_STAGES; s++) {
      w.pos = 0
      writeTopics(w, FIRST_TOPIC_STAGE + s, topics, texts, from, to)
      fragments[s] = fragment(w.out.subarray(0, w.pos))
    }
    if (w.out.length > 1024 * 1024) w.out = Buffer.allocUnsafeSlow(64 * 1024) // one huge chunk is not kept
    const chunk = { ...(found ?? numbersOf(topics, texts, from, to)), fragments: pack(fragments) }
    this.#chunks[c] = chunk
    return chunk
  }

  /** Chunk `c` went out in a bulk (plain) body: its numbers are kept, without fragments. */
  seen(c: number, topics: readonly TopicSeries[], texts: readonly TopicText[]): void {
    this.counts.bulk++
    const from = c * CHUNK_TOPICS
    this.#chunks[c] = numbersOf(topics, texts, from, Math.min(topics.length, from + CHUNK_TOPICS))
  }

  /** The render had `count` chunks: any beyond are gone. */
  keep(count: number): void {
    if (this.#chunks.length > count) this.#chunks.length = count
  }
}

/** What topics [from, to) are, without fragments yet. */
function numbersOf(topics: readonly TopicSeries[], texts: readonly TopicText[], from: number, to: number): Chunk {
  return {
    texts: texts.slice(from, to),
    partitions: topics.slice(from, to).map((topic) => topic.partitionNumbers),
    values: valuesOf(topics, from, to),
    fragments: undefined,
  }
}

export class GzipJob {
  readonly #snapshot: Snapshot
  readonly #renderer: PlainRenderer
  readonly #cache: ChunkCache
  readonly #structure: (snapshot: Snapshot) => Structure
  readonly #finished: (bulk: boolean) => void
  #topics: readonly TopicSeries[] = []
  #texts: readonly TopicText[] = []
  #preamble: Fragment = EMPTY_FRAGMENT
  /** Per chunk: the cached chunk whose numbers are current, found by the first step (or undefined). */
  #found: (Chunk | undefined)[] | undefined
  #chunks: Chunk[] = []
  #next = 0
  /** Bulk mode: the plain render. */
  #plain: PlainJob | undefined
  #result: GzipBody | undefined

  constructor(
    snapshot: Snapshot, renderer: PlainRenderer, cache: ChunkCache,
    structure: (snapshot: Snapshot) => Structure, finished: (bulk: boolean) => void,
  ) {
    this.#snapshot = snapshot
    this.#renderer = renderer
    this.#cache = cache
    this.#structure = structure
    this.#finished = finished
  }

  /** Like RenderJob.step: works until `deadline` or until the result is ready (true). */
  step(deadline: number): boolean {
    if (this.#result !== undefined) return true
    if (this.#found === undefined && this.#plain === undefined) {
      ;({ topics: this.#topics, texts: this.#texts } = this.#structure(this.#snapshot))
      const count = Math.ceil(this.#topics.length / CHUNK_TOPICS)
      const found: (Chunk | undefined)[] = new Array(count)
      let changed = 0
      for (let c = 0; c < count; c++) if ((found[c] = this.#cache.find(c, this.#topics, this.#texts)) === undefined) changed++
      if (changed > count * BULK_SHARE) {
        // The changed chunks' numbers are kept: once they stop changing they are compressed.
        for (let c = 0; c < count; c++) if (found[c] === undefined) this.#cache.seen(c, this.#topics, this.#texts)
        this.#cache.keep(count)
        this.#finished(true)
        this.#plain = this.#renderer.begin(this.#snapshot)
        this.#topics = []
        this.#texts = []
      } else {
        this.#found = found
        this.#chunks = new Array(count)
        const w = new Writer(Buffer.allocUnsafeSlow(1024))
        writePreamble(w, this.#snapshot)
        this.#preamble = fragment(w.take())
      }
    }
    if (this.#plain !== undefined) {
      if (!this.#plain.step(deadline)) return false
      this.#result = { plain: this.#plain.body() }
      return true
    }
    const found = this.#found!
    const chunks = this.#chunks
    while (this.#next < chunks.length) {
      const c = this.#next++
      chunks[c] = this.#cache.compressed(c, this.#topics, this.#texts, found[c])
      if (this.#next < chunks.length && performance.now() >= deadline) return false
    }
    const latency = new Writer(Buffer.allocUnsafeSlow(256))
    writeLatency(latency, this.#snapshot)
    const member = new MemberBuilder()
    member.add(this.#preamble)
    const headers = familyHeaders()
    for (let s = 0; s < TOPIC_STAGES; s++) {
      member.addPacked(headers, s)
      for (let c = 0; c < chunks.length; c++) member.addPacked(chunks[c].fragments!, s)
    }
    member.add(fragment(latency.take()))
    this.#result = { gzip: member.finish() }
    this.#cache.keep(chunks.length)
    this.#finished(false)
    this.#chunks = []
    this.#found = []
    this.#topics = []
    this.#texts = []
    return true
  }

  /**
   * After `step()` returned true: `gzip`, the complete gzip member; or `plain`, the plain body
   * (a body of this renderer: recycle() it once compressed).
   */
  result(): GzipBody {
    if (this.#result === undefined) throw new Error('internal: the gzip render is not complete')
    return this.#result
  }
}

