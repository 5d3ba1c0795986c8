// The /metrics body: text exposition format 0.0.4 (design §2), label values escaped (design §3.2),
// colliding label values merged into one series (design §3.5).
//
// The scrape path writes bytes straight into a Buffer instead of concatenating strings (on a
// 187k-sample scrape, string concatenation spent most of 51–64 ms in garbage collection). Label
// text is escaped and encoded once per series and cached by the snapshot's stable `key` objects,
// so the scrape path copies bytes and writes digits, and never re-escapes. A render can be run in
// slices (`Renderer.begin()` → `RenderJob.step()`): the snapshot is immutable, so a body written
// over several event-loop turns is still exactly the body of that one snapshot.
import { escapeLabelValue } from '../core/labels'
import { Layout, Snapshot } from '../core/snapshot'
import { GroupSeries, TopicSeries, mergeCollisions } from './merge'
import { GZIP_LEVEL } from './gzip'
import { ChunkCache, GzipJob } from './gzip-job'
import {
  GroupText, PARTITION_DEPTH, Stage, Structure, TOPICS_PER_CLOCK_CHECK, TopicText, Writer, encode, headerOf, writeLatency, writePreamble, writeTopics,
} from './text'
import { gzipSync } from 'node:zlib'

/** Group texts kept for reuse; past this many distinct labels the cache starts over. */
const MAX_GROUP_TEXTS = 10_000
/** Output buffers below this cost next to nothing to allocate: they are never kept for reuse. */
const MIN_RECYCLED_BYTES = 64 * 1024
const NO_GROUPS: readonly GroupText[] = Object.freeze([])

/** The cached text still fits: same label, and groups with the same labels in the same order. */
function fits(text: TopicText, topic: TopicSeries): boolean {
  if (text.label !== topic.label) return false
  const groups = topic.groups
  if (text.groups.length !== groups.length) return false
  for (let g = 0; g < groups.length; g++) if (text.groups[g].label !== groups[g].label) return false
  return true
}

export class Renderer {
  /** By the snapshot's stable topic `key`: a removed topic's entry goes with its key. */
  readonly #topicTexts = new WeakMap<object, TopicText>()
  /** By group label value. */
  readonly #groupTexts = new Map<string, GroupText>()
  /** By the JSON of a list of group label values. */
  readonly #groupLists = new Map<string, readonly GroupText[]>()
  /** The previous render's topic keys and texts (see #textsOf), and its snapshot's layout. */
  #lastKeys: readonly object[] = []
  #lastTexts: readonly TopicText[] = []
  #lastLayout: Layout | undefined
  /** Size of the previous body: the next one is usually about as large. */
  #lastSize = 4096
  /**
   * One output buffer handed back by `recycle()` once its body was sent. A fresh 12 MB buffer per
   * scrape (200k samples) was external memory that V8 answered with a full GC every few scrapes:
   * the tail of /metrics under load.
   */
  #spare: Buffer | undefined

  /** The /metrics body for one snapshot, in one go. Same snapshot ⇒ byte-identical output. */
  render(snapshot: Snapshot): Buffer {
    const job = this.begin(snapshot)
    while (!job.step(Infinity));
    return job.body()
  }

  /**
   * A render to be advanced in slices with `step()`. The snapshot must not change meanwhile
   * (lib/core/reader.ts never touches a snapshot it handed out).
   */
  begin(snapshot: Snapshot): RenderJob {
    // The spare buffer if one was handed back (recycle), else a fresh one: a body may still be on
    // its way to a client (or in gzip) while the next scrape renders. Sized from the previous
    // body so it rarely grows; a spare far larger than that (the surface shrank) is let go.
    const wanted = this.#lastSize + (this.#lastSize >> 3) + 4096
    let out = this.#spare
    this.#spare = undefined
    // allocUnsafeSlow: a buffer of its own. A pooled one (Node 24 and 26 pool allocations up to 32 KiB
    // in 64 KiB slabs) shares its ArrayBuffer with other Buffers, which recycle() would then hand to the
    // next render whole, writing over them.
    if (out === undefined || out.length < wanted || out.length > 4 * wanted) out = Buffer.allocUnsafeSlow(wanted)
    return new RenderJob(snapshot, out, (body) => {
      this.#lastSize = body.length
      if (body.buffer.byteLength >= MIN_RECYCLED_BYTES) this.#handedOut.add(body.buffer)
    }, (snapshot) => this.#structure(snapshot))
  }

  /**
   * The /metrics body for one snapshot, gzipped, in slices like `begin()`; its gunzipped bytes are
   * exactly `render(snapshot)`. Topics go in chunks of CHUNK_TOPICS, each family's lines of a
   * chunk compressed on their own (lib/exposition/gzip.ts): a chunk whose numbers and labels are what they
   * were at the previous gzip render is neither rendered nor compressed again. When most chunks
   * changed, fragments would cost more than one pass of zlib over the whole text: the job then
   * renders the plain body for the caller to compress (`GzipJob.result()`).
   */
  beginGzip(snapshot: Snapshot): GzipJob {
    return new GzipJob(snapshot, this, this.#chunks, (snapshot) => this.#structure(snapshot), (bulk) => {
      // Plain bodies went out of use (gzip scrapes built from chunks): a spare buffer would only
      // hold ~60 B per sample of memory. Bulk renders and plain scrapes keep it in use.
      if (!bulk) this.#spare = undefined
    })
  }

  /** The gzip render in one go (a plain result compressed here, synchronously). */
  renderGzip(snapshot: Snapshot): Buffer {
    const job = this.beginGzip(snapshot)
    while (!job.step(Infinity));
    const result = job.result()
    if (result.gzip !== undefined) return result.gzip
    const compressed = gzipSync(result.plain, { level: GZIP_LEVEL })
    this.recycle(result.plain)
    return compressed
  }

  readonly #chunks = new ChunkCache()

  /** Chunks of gzip renders so far: reused as they were, compressed, or seen in a bulk render (diagnostics, tests). */
  get gzipChunks(): { readonly reused: number; readonly rendered: number; readonly bulk: number } {
    return { ...this.#chunks.counts }
  }

  /** The buffers of large bodies handed out and not yet recycled: recycle() takes back only these. */
  readonly #handedOut = new WeakSet<ArrayBufferLike>()

  /**
   * `body` (from a RenderJob of this renderer) is no longer read by anyone: its buffer may take
   * the next render. Anything that is not one of this renderer's large bodies, or was already
   * recycled, is ignored. Call it only when nothing (a socket write, a gzip job, a caller) can
   * still read the body.
   */
  recycle(body: Buffer): void {
    if (this.#handedOut.delete(body.buffer)) this.#spare = Buffer.from(body.buffer, 0, body.buffer.byteLength)
  }

  /**
   * The series of `snapshot` after the collision merge, and their texts. A snapshot whose layout
   * (lib/core/reader.ts: one object per registry generation) says nothing collides is its own series;
   * one with the layout of the previous render has that render's texts too: the topics, their
   * labels and their groups are those of that render (1.7 ms of a 200k-sample render's ~12 went
   * to re-deriving both).
   */
  #structure(snapshot: Snapshot): Structure {
    const layout = snapshot.layout
    if (layout === undefined || !layout.collisionFree) {
      const topics = mergeCollisions(snapshot.topics)
      this.#lastLayout = undefined
      return { topics, texts: this.#textsOf(topics) }
    }
    const topics = snapshot.topics
    if (layout === this.#lastLayout && this.#lastTexts.length === topics.length) return { topics, texts: this.#lastTexts }
    const texts = this.#textsOf(topics)
    this.#lastLayout = layout
    return { topics, texts }
  }

  /**
   * The texts of `topics`, in order. A steady scrape has the same topics as the one before, so
   * the previous list is tried first (an array walk instead of 4,348 WeakMap lookups).
   */
  #textsOf(topics: readonly TopicSeries[]): readonly TopicText[] {
    const texts: TopicText[] = new Array(topics.length)
    const lastKeys = this.#lastKeys
    const lastTexts = this.#lastTexts
    for (let t = 0; t < topics.length; t++) {
      const topic = topics[t]
      const last = lastKeys[t] === topic.key && t < lastTexts.length ? lastTexts[t] : undefined
      texts[t] = last !== undefined && fits(last, topic) ? last : this.#topicText(topic)
    }
    this.#lastKeys = topics.map((topic) => topic.key)
    this.#lastTexts = texts
    return texts
  }

  /** The topic's cached label text, rebuilt when its label or groups changed. */
  #topicText(topic: TopicSeries): TopicText {
    const key = topic.key
    const cacheable = typeof key === 'object' && key !== null
    let text = cacheable ? this.#topicTexts.get(key) : undefined
    if (text === undefined || !fits(text, topic)) {
      // A new object, never an update in place: a sliced render still holds the old one.
      const escaped = escapeLabelValue(topic.label)
      text = {
        label: topic.label,
        depthPrefix: encode(`${PARTITION_DEPTH.name}{topic="${escaped}",partition="`),
        labelsLength: Buffer.byteLength(`{topic="${escaped}"`, 'utf8'),
        groups: this.#groupList(topic.groups),
      }
      if (cacheable) this.#topicTexts.set(key, text)
    }
    return text
  }

  /** The group texts of `groups`, in order: one shared array per distinct list of labels. */
  #groupList(groups: readonly GroupSeries[]): readonly GroupText[] {
    if (groups.length === 0) return NO_GROUPS
    const key = JSON.stringify(groups.map((group) => group.label))
    let list = this.#groupLists.get(key)
    if (list === undefined) {
      if (this.#groupLists.size >= MAX_GROUP_TEXTS) this.#groupLists.clear()
      list = Object.freeze(groups.map((group) => this.#groupText(group.label)))
      this.#groupLists.set(key, list)
    }
    return list
  }

  #groupText(label: string): GroupText {
    let text = this.#groupTexts.get(label)
    if (text === undefined) {
      if (this.#groupTexts.size >= MAX_GROUP_TEXTS) this.#groupTexts.clear()
      text = { label, suffix: encode(`,group="${escapeLabelValue(label)}"} `) }
      this.#groupTexts.set(label, text)
    }
    return text
  }
}

export class RenderJob {
  readonly #snapshot: Snapshot
  readonly #done: (body: Buffer) => void
  readonly #structure: (snapshot: Snapshot) => Structure
  readonly #w: Writer
  #topics: readonly TopicSeries[] = []
  #texts: readonly TopicText[] = []
  #stage: number = Stage.Preamble
  /** Next topic of the current stage. */
  #next = 0

  constructor(snapshot: Snapshot, out: Buffer, done: (body: Buffer) => void, structure: (snapshot: Snapshot) => Structure) {
    this.#snapshot = snapshot
    this.#w = new Writer(out)
    this.#done = done
    this.#structure = structure
  }

  /**
   * Renders until `deadline` (a `performance.now()` time) has passed or the body is complete;
   * true once it is. The clock is read every few dozen topics, so a slice may overrun slightly.
   */
  step(deadline: number): boolean {
    const w = this.#w
    while (this.#stage !== Stage.Done) {
      const stage = this.#stage
      if (stage === Stage.Preamble) {
        writePreamble(w, this.#snapshot)
        ;({ topics: this.#topics, texts: this.#texts } = this.#structure(this.#snapshot))
      } else if (stage < Stage.Latency) {
        const topics = this.#topics
        if (this.#next === 0) w.bytes(headerOf(stage))
        while (this.#next < topics.length) {
          const from = this.#next
          const to = Math.min(topics.length, from + TOPICS_PER_CLOCK_CHECK)
          writeTopics(w, stage, topics, this.#texts, from, to)
          this.#next = to
          if (performance.now() >= deadline && to < topics.length) return false
        }
      } else {
        writeLatency(w, this.#snapshot)
      }
      this.#stage++
      this.#next = 0
    }
    return true
  }

  /** The complete body (after `step()` returned true). */
  body(): Buffer {
    if (this.#stage !== Stage.Done) throw new Error('internal: the render is not complete')
    const body = this.#w.take()
    this.#done(body)
    return body
  }
}

