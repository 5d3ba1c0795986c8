// The /metrics body: text exposition format 0.0.4 (design §2), label values escaped (design §3.2),
// colliding label values merged into one series (design §3.5).
//
// The scrape path writes bytes straight into a Buffer instead of concatenating strings (on a
// 187k-sample scrape, string concatenation spent most of 51–64 ms in garbage collection). Label
// text is escaped and encoded once per series and cached by the snapshot's stable `key` objects,
// so the scrape path copies bytes and writes digits, and never re-escapes. A render can be run in
// slices (`Renderer.begin()` → `RenderJob.step()`): the snapshot is immutable, so a body written
// over several event-loop turns is still exactly the body of that one snapshot.
import { METRICS, MetricDefinition } from './allowlist'
import { escapeHelp, escapeLabelValue } from '../core/labels'
import { Count, Layout, Snapshot, TopicSnapshot, addCount, isCollisionFree } from '../core/snapshot'
import { gzipSync } from 'node:zlib'
import { EMPTY_FRAGMENT, Fragment, GZIP_LEVEL, GzipBody, MemberBuilder, PackedFragments, fragment, pack } from './gzip'

/** design §2: floats in the shortest round-trip form; NaN and ±Inf as Prometheus spells them. */
export function formatFloat(value: number): string {
  if (value === Infinity) return '+Inf'
  if (value === -Infinity) return '-Inf'
  return String(value) // 'NaN' for NaN; shortest round-trip decimal otherwise
}

// ---------------------------------------------------------------------------------------------
// Series after the collision merge (design §3.5). A TopicSnapshot without collisions already has
// this shape and is used as it is; only colliding topics/groups get merged copies.

interface GroupSeries {
  readonly label: string
  readonly key: object
  readonly lag: number
  readonly inFlight: Count
  readonly retries: Count
}

interface TopicSeries {
  readonly label: string
  readonly key: object
  readonly produced: Count
  readonly delivered: Count
  readonly dropped: Count
  readonly dlq: Count
  readonly bytes: Count
  /** Ascending partition numbers; `lastSeq` and `depth` are parallel to it. */
  readonly partitionNumbers: readonly number[]
  readonly lastSeq: readonly number[]
  readonly depth: readonly Count[]
  readonly groups: readonly GroupSeries[]
}

/**
 * One series per distinct topic label, ascending by label; inside each, one partition series per
 * partition number (ascending) and one group series per group label (ascending). Relies on the
 * snapshot's documented order to find collisions as neighbours, and checks that order rather than
 * trusting it: an out-of-order snapshot is sorted first, never rendered with duplicates.
 */
function mergeCollisions(snapshotTopics: readonly TopicSnapshot[]): readonly TopicSeries[] {
  let topics = snapshotTopics
  for (let i = 1; i < topics.length; i++) {
    if (topics[i].label < topics[i - 1].label) {
      topics = [...topics].sort((a, b) => compareStrings(a.label, b.label) || compareStrings(a.name, b.name))
      break
    }
  }
  const series: TopicSeries[] = []
  for (let i = 0; i < topics.length; ) {
    let end = i + 1
    while (end < topics.length && topics[end].label === topics[i].label) end++
    series.push(end === i + 1 && isCollisionFree(topics[i]) ? topics[i] : mergeTopics(topics.slice(i, end)))
    i = end
  }
  return series
}

/** design §3.5: counters, depth and in_flight summed; last_seq and lag take the maximum. */
function mergeTopics(run: readonly TopicSnapshot[]): TopicSeries {
  let produced: Count = 0
  let delivered: Count = 0
  let dropped: Count = 0
  let dlq: Count = 0
  let bytes: Count = 0
  const partitions = new Map<number, { depth: Count; lastSeq: number }>()
  const groups = new Map<string, { label: string; key: object; lag: number; inFlight: Count; retries: Count }>()
  for (const topic of run) {
    produced = addCount(produced, topic.produced)
    delivered = addCount(delivered, topic.delivered)
    dropped = addCount(dropped, topic.dropped)
    dlq = addCount(dlq, topic.dlq)
    bytes = addCount(bytes, topic.bytes)
    topic.partitionNumbers.forEach((partition, p) => {
      const merged = partitions.get(partition)
      if (merged === undefined) {
        partitions.set(partition, { depth: topic.depth[p], lastSeq: topic.lastSeq[p] })
      } else {
        merged.depth = addCount(merged.depth, topic.depth[p])
        if (topic.lastSeq[p] > merged.lastSeq) merged.lastSeq = topic.lastSeq[p]
      }
    })
    for (const g of topic.groups) {
      const merged = groups.get(g.label)
      if (merged === undefined) {
        groups.set(g.label, { label: g.label, key: g.key, lag: g.lag, inFlight: g.inFlight, retries: g.retries })
      } else {
        if (g.lag > merged.lag) merged.lag = g.lag
        merged.inFlight = addCount(merged.inFlight, g.inFlight)
        merged.retries = addCount(merged.retries, g.retries)
      }
    }
  }
  const partitionNumbers = [...partitions.keys()].sort((a, b) => a - b)
  return {
    label: run[0].label,
    key: run[0].key,
    produced,
    delivered,
    dropped,
    dlq,
    bytes,
    partitionNumbers,
    lastSeq: partitionNumbers.map((partition) => partitions.get(partition)!.lastSeq),
    depth: partitionNumbers.map((partition) => partitions.get(partition)!.depth),
    groups: [...groups.values()].sort((a, b) => compareStrings(a.label, b.label)),
  }
}

function compareStrings(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0
}

// ---------------------------------------------------------------------------------------------
// Bytes that never change: family headers, metric names, punctuation.

const encode = (text: string): Uint8Array => Buffer.from(text, 'utf8')

function family(name: string): MetricDefinition & { header: Uint8Array; nameBytes: Uint8Array } {
  const definition = METRICS.find((metric) => metric.name === name)
  if (definition === undefined) throw new Error(`internal: ${name} is not in the allowlist`)
  return {
    ...definition,
    header: encode(`# HELP ${definition.name} ${escapeHelp(definition.help)}\n# TYPE ${definition.name} ${definition.type}\n`),
    nameBytes: encode(definition.name),
  }
}

const UPTIME = family('mq_broker_uptime_seconds')
const CONNECTIONS = family('mq_connections')
const LEADER_EPOCH = family('mq_leader_epoch')
const QUORUM_STATE = family('mq_quorum_state')
const PRODUCED = family('mq_topic_messages_produced_total')
const DELIVERED = family('mq_topic_messages_delivered_total')
const DROPPED = family('mq_topic_messages_dropped_total')
const DLQ = family('mq_topic_messages_dlq_total')
const BYTES = family('mq_topic_bytes_total')
const PARTITION_DEPTH = family('mq_partition_depth')
const PARTITION_LAST_SEQ = family('mq_partition_last_seq')
const GROUP_LAG = family('mq_group_lag')
const GROUP_IN_FLIGHT = family('mq_group_in_flight')
const GROUP_RETRIES = family('mq_group_retries_total')
const LATENCY = family('mq_e2e_latency_ms')

// The renderer below is written for exactly this order; fail at load time if the data moves.
const RENDER_ORDER = [
  UPTIME, CONNECTIONS, LEADER_EPOCH, QUORUM_STATE, PRODUCED, DELIVERED, DROPPED, DLQ, BYTES,
  PARTITION_DEPTH, PARTITION_LAST_SEQ, GROUP_LAG, GROUP_IN_FLIGHT, GROUP_RETRIES, LATENCY,
]
if (RENDER_ORDER.length !== METRICS.length || RENDER_ORDER.some((f, i) => f.name !== METRICS[i].name)) {
  throw new Error('internal: render order differs from the allowlist')
}

/** The per-topic families, in render order, and how each reads its value. */
const TOPIC_FAMILIES: readonly [Uint8Array, (topic: TopicSeries) => Count][] = [
  [PRODUCED.nameBytes, (topic) => topic.produced],
  [DELIVERED.nameBytes, (topic) => topic.delivered],
  [DROPPED.nameBytes, (topic) => topic.dropped],
  [DLQ.nameBytes, (topic) => topic.dlq],
  [BYTES.nameBytes, (topic) => topic.bytes],
]
const GROUP_FAMILIES: readonly [Uint8Array, (group: GroupSeries) => Count][] = [
  [GROUP_LAG.nameBytes, (group) => group.lag],
  [GROUP_IN_FLIGHT.nameBytes, (group) => group.inFlight],
  [GROUP_RETRIES.nameBytes, (group) => group.retries],
]

const LATENCY_LINES = (['p50', 'p90', 'p99'] as const).map((quantile) => [quantile, encode(`${LATENCY.name}{quantile="${quantile}"} `)] as const)
const SPACE = 0x20
const NEWLINE = 0x0a
const QUOTE = 0x22
const CLOSE_BRACE = 0x7d
const ZERO = 0x30
/** Room for any value the fast path writes (a safe integer: ≤ 16 digits) and the line's end. */
const VALUE_ROOM = 24
/** `"} ` after a partition number. */
const PARTITION_END = 3
const PARTITION_END_BYTES = encode('"} ')
/** Ends a topic line's label set. */
const LABELS_END = encode('} ')
/** 16 digits hold any safe integer. */
const SAFE_INTEGER_DIGITS = 16
const INT32_MAX = 0x7fffffff
/** Topics rendered between two looks at the clock (a look costs ~50 ns; 32 topics ~30 µs). */
const TOPICS_PER_CLOCK_CHECK = 32

// Label text of one topic's series, escaped and encoded once (design §3.2: the escape runs); metric
// names are copied from the constants above. One array per topic holds its text, the depth
// prefix: a depth line copies it whole with one .set(); a last_seq line takes its part from
// `{topic="` on; topic and group lines copy the short `{topic="<t>"` byte by byte. Each array
// object more per topic would cost ~100 B (2 B per sample at the workload), and these
// copies measured as fast as arrays of their own. A group's part of its label set depends only on
// the group's label value, so it is shared by every topic, and so is a list of groups (most topics
// of a broker have the same ones).
interface TopicText {
  readonly label: string
  /**
   * `mq_partition_depth{topic="<t>",partition="`; a last_seq line's prefix is the last_seq name and
   * the same from LABELS_AT on.
   */
  readonly depthPrefix: Uint8Array
  /**
   * Length of `{topic="<t>"`, which is depthPrefix[LABELS_AT, LABELS_AT + labelsLength) (a topic
   * line adds `} `, a group line its group's `,group="<g>"} `).
   */
  readonly labelsLength: number
  /** The group texts of the topic's groups, in order (re-checked against the labels every render). */
  readonly groups: readonly GroupText[]
}

interface GroupText {
  readonly label: string
  /** `,group="<g>"} ` */
  readonly suffix: Uint8Array
}

/** Where `{topic="` starts in a depth prefix. */
const LABELS_AT = PARTITION_DEPTH.name.length

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
    if (out === undefined || out.length < wanted || out.length > 4 * wanted) out = Buffer.allocUnsafe(wanted)
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

/** Stages of a render, in output order. */
const enum Stage {
  Preamble = 0,
  TopicFamilies = 1, // 5 families, TOPIC_FAMILIES
  PartitionDepth = 6,
  PartitionLastSeq = 7,
  GroupFamilies = 8, // 3 families, GROUP_FAMILIES
  Latency = 11,
  Done = 12,
}
/** The stages that have a line (or lines) per topic: TopicFamilies … the last group family. */
const FIRST_TOPIC_STAGE = Stage.TopicFamilies
const TOPIC_STAGES = Stage.Latency - Stage.TopicFamilies

/** The family header of a per-topic stage. */
function headerOf(stage: number): Uint8Array {
  return RENDER_ORDER[stage + 3].header
}

/** Everything up to the per-topic families: four unlabelled gauges. */
function writePreamble(w: Writer, snapshot: Snapshot): void {
  w.bytes(UPTIME.header)
  w.unlabelled(UPTIME, formatFloat(snapshot.uptimeSeconds))
  w.bytes(CONNECTIONS.header)
  w.unlabelled(CONNECTIONS, snapshot.connections)
  w.bytes(LEADER_EPOCH.header)
  w.unlabelled(LEADER_EPOCH, snapshot.leaderEpoch)
  w.bytes(QUORUM_STATE.header)
  w.unlabelled(QUORUM_STATE, snapshot.quorumState)
}

function writeLatency(w: Writer, snapshot: Snapshot): void {
  w.bytes(LATENCY.header)
  const latency = snapshot.latency
  if (latency !== null) {
    for (const [quantile, prefix] of LATENCY_LINES) {
      w.bytes(prefix)
      w.ascii(formatFloat(latency[quantile]))
      w.newline()
    }
  }
}

/** The lines of one per-topic `stage` for topics [from, to) (not the family header). */
function writeTopics(w: Writer, stage: number, topics: readonly TopicSeries[], texts: readonly TopicText[], from: number, to: number): void {
  if (stage < Stage.PartitionDepth) {
    const [name, valueOf] = TOPIC_FAMILIES[stage - Stage.TopicFamilies]
    for (let t = from; t < to; t++) w.line(name, texts[t], LABELS_END, valueOf(topics[t]))
  } else if (stage === Stage.PartitionDepth) {
    for (let t = from; t < to; t++) w.partitionLines(undefined, texts[t].depthPrefix, 0, topics[t].partitionNumbers, topics[t].depth)
  } else if (stage === Stage.PartitionLastSeq) {
    for (let t = from; t < to; t++) w.partitionLines(PARTITION_LAST_SEQ.nameBytes, texts[t].depthPrefix, LABELS_AT, topics[t].partitionNumbers, topics[t].lastSeq)
  } else {
    const [name, valueOf] = GROUP_FAMILIES[stage - Stage.GroupFamilies]
    for (let t = from; t < to; t++) {
      const text = texts[t]
      const groups = topics[t].groups
      for (let g = 0; g < groups.length; g++) w.line(name, text, text.groups[g].suffix, valueOf(groups[g]))
    }
  }
}

/** What a render writes lines for: the series after the collision merge, and their texts. */
interface Structure {
  readonly topics: readonly TopicSeries[]
  readonly texts: readonly TopicText[]
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

// ---------------------------------------------------------------------------------------------
// The gzip render: per-chunk fragments, reused while a chunk does not change.

/** Topics per chunk: ~1,400 samples at 16 partitions × 2 groups; ~80 KB of text. */
export const CHUNK_TOPICS = 32

/**
 * What one chunk's fragments were rendered from: the topics' texts (same object ⇒ same topic key,
 * label and group labels), partition numbers and every number a line shows.
 */
interface Chunk {
  readonly texts: readonly TopicText[]
  readonly partitions: readonly (readonly number[])[]
  /** Int32Array when every value is an int32 (the common case: half the memory), else Float64Array. */
  readonly values: Int32Array | Float64Array
  /** One per per-topic stage, in render order; none yet for a chunk last seen in a bulk render. */
  readonly fragments: PackedFragments | undefined
}

/** Every number the lines of topics [from, to) show, in a fixed order; NaN for a bigint. */
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
    for (let p = 0; p < lastSeq.length; p++) values[i++] = numeric(lastSeq[p])
    for (let p = 0; p < depth.length; p++) values[i++] = numeric(depth[p])
    for (let g = 0; g < groups.length; g++) {
      values[i++] = numeric(groups[g].lag)
      values[i++] = numeric(groups[g].inFlight)
      values[i++] = numeric(groups[g].retries)
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
    for (let p = 0; p < lastSeq.length; p++) if (values[i++] !== lastSeq[p]) return false
    for (let p = 0; p < depth.length; p++) if (values[i++] !== depth[p]) return false
    for (let g = 0; g < groups.length; g++) {
      const group = groups[g]
      if (values[i] !== group.lag || values[i + 1] !== group.inFlight || values[i + 2] !== group.retries) return false
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
class ChunkCache {
  readonly counts = { reused: 0, rendered: 0, bulk: 0 }
  readonly #chunks: (Chunk | undefined)[] = []
  /** Renders one family of one chunk at a time, for compression (no yield while it is in use). */
  readonly #scratch = new Writer(Buffer.allocUnsafe(64 * 1024))

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
    if (w.out.length > 1024 * 1024) w.out = Buffer.allocUnsafe(64 * 1024) // one huge chunk is not kept
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
  readonly #renderer: Renderer
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
  #plain: RenderJob | undefined
  #result: GzipBody | undefined

  constructor(
    snapshot: Snapshot, renderer: Renderer, cache: ChunkCache,
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
        const w = new Writer(Buffer.allocUnsafe(1024))
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
    const latency = new Writer(Buffer.allocUnsafe(256))
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

/** Bytes into a Buffer that grows as needed. */
class Writer {
  out: Buffer
  pos = 0

  constructor(out: Buffer) {
    this.out = out
  }

  /** The bytes written; the writer lets go of its buffer (a body is never kept alive by it). */
  take(): Buffer {
    const body = this.out.subarray(0, this.pos)
    this.out = Buffer.allocUnsafe(0)
    this.pos = 0
    return body
  }

  unlabelled(metric: { nameBytes: Uint8Array }, value: number | string): void {
    this.bytes(metric.nameBytes)
    this.room(1)
    this.out[this.pos++] = SPACE
    if (typeof value === 'string') this.ascii(value)
    else this.value(value)
    this.newline()
  }

  /** `name` + the topic's `{topic="<t>"` + `end` (which ends with `} `) + value + newline. */
  line(name: Uint8Array, text: TopicText, end: Uint8Array, value: Count): void {
    const labelsLength = text.labelsLength
    const out = this.room(name.length + labelsLength + end.length + VALUE_ROOM)
    let pos = this.pos
    out.set(name, pos)
    pos += name.length
    const source = text.depthPrefix
    for (let i = LABELS_AT, stop = LABELS_AT + labelsLength; i < stop; i++) out[pos++] = source[i]
    if (end.length === 2) {
      out[pos] = end[0]
      out[pos + 1] = end[1]
    } else {
      out.set(end, pos)
    }
    pos += end.length
    if (typeof value === 'number' && isSafeCount(value)) {
      pos = writeDigits(out, pos, value)
      out[pos++] = NEWLINE
      this.pos = pos
    } else {
      this.pos = pos
      this.value(value)
      this.newline()
    }
  }

  /**
   * One line per partition: prefix N `"} ` value, where the prefix (ending in `partition="`) is
   * `name` (if given) followed by `source[from…]`. The hot loop of a scrape (2 × 16 of the 43 lines
   * per topic at the workload): room for all of them is made at once, the buffer and
   * position stay in locals, and the first line's prefix is copied to the others (copyWithin: one
   * memmove, as fast as a .set of a prefix array — so last_seq needs no prefix array of its own).
   */
  partitionLines(name: Uint8Array | undefined, source: Uint8Array, from: number, partitions: readonly number[], values: readonly Count[]): void {
    const length = (name === undefined ? 0 : name.length) + source.length - from
    const lineRoom = length + SAFE_INTEGER_DIGITS + PARTITION_END + VALUE_ROOM
    let out = this.room(partitions.length * lineRoom)
    let pos = this.pos
    let prefixAt = -1
    for (let p = 0; p < partitions.length; p++) {
      const partition = partitions[p]
      const value = values[p]
      if (prefixAt >= 0) {
        out.copyWithin(pos, prefixAt, prefixAt + length)
      } else {
        prefixAt = pos
        let at = pos
        if (name !== undefined) {
          out.set(name, at)
          at += name.length
        }
        if (from === 0) out.set(source, at)
        else for (let i = from; i < source.length; i++) out[at++] = source[i]
      }
      pos += length
      if (typeof value === 'number' && isSafeCount(value) && isSafeCount(partition)) {
        pos = writeDigits(out, pos, partition)
        out[pos] = QUOTE
        out[pos + 1] = CLOSE_BRACE
        out[pos + 2] = SPACE
        pos = writeDigits(out, pos + PARTITION_END, value)
        out[pos++] = NEWLINE
      } else {
        // A bigint (a merged depth past 2^53) or a value that is not a count: the general writer.
        this.pos = pos
        this.value(partition)
        this.bytes(PARTITION_END_BYTES)
        this.value(value)
        this.newline()
        out = this.room((partitions.length - p - 1) * lineRoom)
        pos = this.pos
      }
    }
    this.pos = pos
  }

  /** The buffer, with room for `n` more bytes (writes past a Buffer's end would be dropped silently). */
  room(n: number): Buffer {
    if (this.pos + n <= this.out.length) return this.out
    const grown = Buffer.allocUnsafe(Math.max(this.out.length * 2, this.pos + n, 256))
    this.out.copy(grown, 0, 0, this.pos)
    this.out = grown
    return grown
  }

  bytes(bytes: Uint8Array): void {
    this.room(bytes.length).set(bytes, this.pos)
    this.pos += bytes.length
  }

  newline(): void {
    this.room(1)[this.pos++] = NEWLINE
  }

  /** An ASCII string (digits of a bigint, a float). */
  ascii(text: string): void {
    this.pos += this.room(text.length).write(text, this.pos, 'latin1')
  }

  /** design §2: integers print exactly — bigints above 2^53 included. */
  value(value: Count): void {
    if (typeof value === 'bigint') {
      this.ascii(value.toString())
    } else if (isSafeCount(value)) {
      this.pos = writeDigits(this.room(VALUE_ROOM), this.pos, value)
    } else {
      // Not a count (negative, fractional, NaN): still print it faithfully rather than lie.
      this.ascii(formatFloat(value))
    }
  }
}

function isSafeCount(value: number): boolean {
  return value >= 0 && value <= Number.MAX_SAFE_INTEGER && Math.floor(value) === value
}

/**
 * The decimal digits of a safe non-negative integer at `pos`; returns the end. Below 2^31 the
 * divisions are int32 (`| 0`), which V8 turns into a multiply; above, float division and floor.
 */
export function writeDigits(out: Uint8Array, pos: number, value: number): number {
  if (value < 10) {
    out[pos] = ZERO + value
    return pos + 1
  }
  if (value <= INT32_MAX) {
    let v = value | 0
    const end = pos + int32Digits(v)
    let at = end
    while (v >= 10) {
      const quotient = (v / 10) | 0
      out[--at] = ZERO + (v - quotient * 10)
      v = quotient
    }
    out[--at] = ZERO + v
    return end
  }
  let digits = 10
  for (let power = 1e10; power <= value; power *= 10) digits++
  const end = pos + digits
  let at = end
  while (value >= 10) {
    const quotient = Math.floor(value / 10)
    out[--at] = ZERO + (value - quotient * 10)
    value = quotient
  }
  out[--at] = ZERO + value
  return end
}

function int32Digits(v: number): number {
  if (v < 100000) return v < 100 ? 2 : v < 1000 ? 3 : v < 10000 ? 4 : 5
  return v < 1000000 ? 6 : v < 10000000 ? 7 : v < 100000000 ? 8 : v < 1000000000 ? 9 : 10
}
