// The exposition's text, as bytes: family headers and metric names, each topic's label text
// escaped and encoded once (design §3.2), the render's stages in output order, and the writer
// that puts lines into a Buffer. Shared by the plain render (render.ts) and the gzip job
// (gzip-job.ts).
import { METRICS, MetricDefinition } from './allowlist'
import { escapeHelp } from '../core/labels'
import { Count, Snapshot } from '../core/snapshot'
import { GroupSeries, TopicSeries } from './merge'
import { formatFloat, isSafeCount, writeDigits } from './digits'

// ---------------------------------------------------------------------------------------------
// Bytes that never change: family headers, metric names, punctuation.

export const encode = (text: string): Uint8Array => Buffer.from(text, 'utf8')

export function family(name: string): MetricDefinition & { header: Uint8Array; nameBytes: Uint8Array } {
  const definition = METRICS.find((metric) => metric.name === name)
  if (definition === undefined) throw new Error(`internal: ${name} is not in the allowlist`)
  return {
    ...definition,
    header: encode(`# HELP ${definition.name} ${escapeHelp(definition.help)}\n# TYPE ${definition.name} ${definition.type}\n`),
    nameBytes: encode(definition.name),
  }
}

export const UPTIME = family('mq_broker_uptime_seconds')
export const CONNECTIONS = family('mq_connections')
export const LEADER_EPOCH = family('mq_leader_epoch')
export const QUORUM_STATE = family('mq_quorum_state')
export const PRODUCED = family('mq_topic_messages_produced_total')
export const DELIVERED = family('mq_topic_messages_delivered_total')
export const DROPPED = family('mq_topic_messages_dropped_total')
export const DLQ = family('mq_topic_messages_dlq_total')
export const BYTES = family('mq_topic_bytes_total')
export const PARTITION_DEPTH = family('mq_partition_depth')
export const PARTITION_LAST_SEQ = family('mq_partition_last_seq')
export const GROUP_LAG = family('mq_group_lag')
export const GROUP_IN_FLIGHT = family('mq_group_in_flight')
export const GROUP_RETRIES = family('mq_group_retries_total')
export const LATENCY = family('mq_e2e_latency_ms')

// The renderer below is written for exactly this order; fail at load time if the data moves.
export const RENDER_ORDER = [
  UPTIME, CONNECTIONS, LEADER_EPOCH, QUORUM_STATE, PRODUCED, DELIVERED, DROPPED, DLQ, BYTES,
  PARTITION_DEPTH, PARTITION_LAST_SEQ, GROUP_LAG, GROUP_IN_FLIGHT, GROUP_RETRIES, LATENCY,
]
if (RENDER_ORDER.length !== METRICS.length || RENDER_ORDER.some((f, i) => f.name !== METRICS[i].name)) {
  throw new Error('internal: render order differs from the allowlist')
}

/** The per-topic families, in render order, and how each reads its value. */
export const TOPIC_FAMILIES: readonly [Uint8Array, (topic: TopicSeries) => Count][] = [
  [PRODUCED.nameBytes, (topic) => topic.produced],
  [DELIVERED.nameBytes, (topic) => topic.delivered],
  [DROPPED.nameBytes, (topic) => topic.dropped],
  [DLQ.nameBytes, (topic) => topic.dlq],
  [BYTES.nameBytes, (topic) => topic.bytes],
]
export const GROUP_FAMILIES: readonly [Uint8Array, (group: GroupSeries) => Count][] = [
  [GROUP_LAG.nameBytes, (group) => group.lag],
  [GROUP_IN_FLIGHT.nameBytes, (group) => group.inFlight],
  [GROUP_RETRIES.nameBytes, (group) => group.retries],
]

export const LATENCY_LINES = (['p50', 'p90', 'p99'] as const).map((quantile) => [quantile, encode(`${LATENCY.name}{quantile="${quantile}"} `)] as const)
export const SPACE = 0x20
export const NEWLINE = 0x0a
export const QUOTE = 0x22
export const CLOSE_BRACE = 0x7d
/** Room for any value the fast path writes (a safe integer: ≤ 16 digits) and the line's end. */
export const VALUE_ROOM = 24
/** `"} ` after a partition number. */
export const PARTITION_END = 3
export const PARTITION_END_BYTES = encode('"} ')
/** Ends a topic line's label set. */
export const LABELS_END = encode('} ')
/** 16 digits hold any safe integer. */
export const SAFE_INTEGER_DIGITS = 16
/** Topics rendered between two looks at the clock (a look costs ~50 ns; 32 topics ~30 µs). */
export const TOPICS_PER_CLOCK_CHECK = 32

// Label text of one topic's series, escaped and encoded once (design §3.2: the escape runs); metric
// names are copied from the constants above. One array per topic holds its text, the depth
// prefix: a depth line copies it whole with one .set(); a last_seq line takes its part from
// `{topic="` on; topic and group lines copy the short `{topic="<t>"` byte by byte. Each array
// object more per topic would cost ~100 B (2 B per sample at the workload), and these
// copies measured as fast as arrays of their own. A group's part of its label set depends only on
// the group's label value, so it is shared by every topic, and so is a list of groups (most topics
// of a broker have the same ones).
export interface TopicText {
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

export interface GroupText {
  readonly label: string
  /** `,group="<g>"} ` */
  readonly suffix: Uint8Array
}

/** Where `{topic="` starts in a depth prefix. */
export const LABELS_AT = PARTITION_DEPTH.name.length

/** Stages of a render, in output order. */
export const enum Stage {
  Preamble = 0,
  TopicFamilies = 1, // 5 families, TOPIC_FAMILIES
  PartitionDepth = 6,
  PartitionLastSeq = 7,
  GroupFamilies = 8, // 3 families, GROUP_FAMILIES
  Latency = 11,
  Done = 12,
}
/** The stages that have a line (or lines) per topic: TopicFamilies … the last group family. */
export const FIRST_TOPIC_STAGE = Stage.TopicFamilies
export const TOPIC_STAGES = Stage.Latency - Stage.TopicFamilies

/** The family header of a per-topic stage. */
export function headerOf(stage: number): Uint8Array {
  return RENDER_ORDER[stage + 3].header
}

/** Everything up to the per-topic families: four unlabelled gauges. */
export function writePreamble(w: Writer, snapshot: Snapshot): void {
  w.bytes(UPTIME.header)
  w.unlabelled(UPTIME, formatFloat(snapshot.uptimeSeconds))
  w.bytes(CONNECTIONS.header)
  w.unlabelled(CONNECTIONS, snapshot.connections)
  w.bytes(LEADER_EPOCH.header)
  w.unlabelled(LEADER_EPOCH, snapshot.leaderEpoch)
  w.bytes(QUORUM_STATE.header)
  w.unlabelled(QUORUM_STATE, snapshot.quorumState)
}

export function writeLatency(w: Writer, snapshot: Snapshot): void {
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
export function writeTopics(w: Writer, stage: number, topics: readonly TopicSeries[], texts: readonly TopicText[], from: number, to: number): void {
  if (stage < Stage.PartitionDepth) {
    const [name, valueOf] = TOPIC_FAMILIES[stage - Stage.TopicFamilies]
    for (let t = from; t < to; t++) w.line(name, texts[t], LABELS_END, valueOf(topics[t]))
  } else if (stage === Stage.PartitionDepth) {
    for (let t = from; t < to; t++) w.partitionLines(undefined, texts[t].depthPrefix, 0, topics[t].partitionNumbers, topics[t].depth)
  } else if (stage === Stage.PartitionLastSeq) {
    for (let t = from; t < to; t++) w.partitionLines(PARTITION_LAST_SEQ.nameBytes, texts[t].depthPrefix, LABELS_AT, topics[t].partitionNumbers, topics[t].lastSeq)
  } else {
    const [name, valueOf] = GROUP_FAMILIES[stage - Stage.GroupFamilies]
    // A topic a group left lately shows its groups without retries lines (lib/core/left.ts).
    const retries = stage === Stage.GroupFamilies + 2
    for (let t = from; t < to; t++) {
      if (retries && topics[t].groupLeft === true) continue
      const text = texts[t]
      const groups = topics[t].groups
      for (let g = 0; g < groups.length; g++) w.line(name, text, text.groups[g].suffix, valueOf(groups[g]))
    }
  }
}

/** What a render writes lines for: the series after the collision merge, and their texts. */
export interface Structure {
  readonly topics: readonly TopicSeries[]
  readonly texts: readonly TopicText[]
}

/** Bytes into a Buffer that grows as needed. */
export class Writer {
  out: Buffer
  pos = 0

  constructor(out: Buffer) {
    this.out = out
  }

  /** The bytes written; the writer lets go of its buffer (a body is never kept alive by it). */
  take(): Buffer {
    const body = this.out.subarray(0, this.pos)
    this.out = Buffer.allocUnsafeSlow(0) // not a pool's slice either: a take() with nothing written would hand out the pool
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
    const grown = Buffer.allocUnsafeSlow(Math.max(this.out.length * 2, this.pos + n, 256)) // never pooled: a body's ArrayBuffer is its own (render.ts recycle())
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
