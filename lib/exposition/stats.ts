// design §7: `/stats?filter=VIEW` and `surface.stats(view, { topic, group })`. Every view is a plain
// object `{ filter: VIEW, ... }` whose integers are exact Counts (number, or bigint above 2^53 − 1);
// the HTTP layer writes it with lib/core/json.ts, which prints a bigint as its bare digits.
//
// Narrowing (optional, exact raw names, never an error when nothing matches):
//   topic=T  keeps only the topic whose raw name is T;
//   group=G  keeps only groups whose raw name is G and, in per-topic views (topics, partitions,
//            conservation), only the topics that have such a group.
// The broker-wide views (quorum, latency, faults, config) ignore both.
import { MqMetricsError, StatsErrorCode } from '../core/errors'
import { ChunkWriter, JsonChunks, Listing, materialize, toJSON } from '../core/json'
import { describe, isPlainObject, MAX_NAME_LENGTH, ownOption } from '../core/labels'
import type { ConservationReport, ConservationTopic } from '../core/conservation'
import type { ResolvedConfig } from '../core/config'
import type { FaultLogView } from '../core/faults'
import { RUNBOOK_LEVELS, TIER_NAMES } from '../core/quorum'
import { addCount, type Carried, type Count, type Snapshot, type TopicSnapshot } from '../core/snapshot'

export const STATS_VIEWS = ['topics', 'partitions', 'groups', 'quorum', 'latency', 'conservation', 'faults', 'collisions', 'config'] as const
export type StatsView = (typeof STATS_VIEWS)[number]

/** Query parameters `/stats` accepts. */
export const STATS_PARAMS = ['filter', 'topic', 'group'] as const

export interface StatsFilter {
  topic?: string
  group?: string
}

export interface StatsContext {
  snapshot: Snapshot
  faults: FaultLogView
  config: ResolvedConfig
  conservation: ConservationReport
  backend: 'native' | 'js'
  backendReason: string
}

// The shape of each view (`surface.stats(view)` returns StatsViews[view]).
export interface TopicsView {
  filter: 'topics'
  topics: { topic: string; label: string; produced: Count; delivered: Count; dropped: Count; dlq: Count; bytes: Count; partitions: number; groups: number }[]
  totals: Record<'produced' | 'delivered' | 'dropped' | 'dlq' | 'bytes', Count>
}
export interface PartitionsView {
  filter: 'partitions'
  partitions: { topic: string; label: string; partition: number; last_seq: number; depth: number }[]
}
export interface GroupsView {
  filter: 'groups'
  groups: {
    topic: string; topic_label: string; group: string; label: string
    delivered: Count; dropped: Count; dlq: Count; retries: Count
    in_flight: number; max_in_flight: number; lag: number; depth: Count
    /** By partition number (as a string key). */
    ack_floors: Record<string, number>
  }[]
}
export interface QuorumView {
  filter: 'quorum'
  quorum_state: number
  status: string
  runbook_level: number
  replicas: number
  in_sync: number
  /** The replicas out of sync, as the broker's last replicationRound() named them ([] when it said none lags); null when it did not name them. */
  lagging: readonly string[] | null
  leader_epoch: number
  connections: number
  uptime_seconds: number
}
export interface LatencyView {
  filter: 'latency'
  enabled: boolean
  p50: number | null
  p90: number | null
  p99: number | null
  count: number
}
export interface ConservationView extends ConservationReport {
  filter: 'conservation'
}
export interface FaultsView extends FaultLogView {
  filter: 'faults'
}
export interface CollisionsView {
  filter: 'collisions'
  /** `removed`: what removed topics of the label still add to its series (design §3.5), when they add anything. */
  topics: { label: string; names: string[]; removed?: RemovedShare }[]
  /** `removed_retries`: the retries removed groups of the label still add to its series. */
  groups: { topic_label: string; label: string; names: { topic: string; group: string }[]; removed_retries?: Count }[]
}
/** The counters and last_seq (by partition) that removed names left in their label's series. */
export interface RemovedShare {
  produced: Count
  delivered: Count
  dropped: Count
  dlq: Count
  bytes: Count
  last_seq: Record<string, number>
}
export interface ConfigView {
  filter: 'config'
  metrics_enabled: boolean
  max_in_flight: number
  max_attempts: number
  e2e_latency: boolean
  e2e_latency_timer: boolean
  metrics_auth_token: 'set' | 'unset'
  max_topics: number
  max_partitions_per_topic: number
  max_groups_per_topic: number
  backend: 'native' | 'js'
  /** Where the native core came from, or why the TypeScript backend runs (docs/install.md). */
  backend_reason: string
}
export interface StatsViews {
  topics: TopicsView
  partitions: PartitionsView
  groups: GroupsView
  quorum: QuorumView
  latency: LatencyView
  conservation: ConservationView
  faults: FaultsView
  collisions: CollisionsView
  config: ConfigView
}

export type { StatsErrorCode }

/** A bad `/stats` request (or `surface.stats()` call): HTTP 400 with a stable code. */
export class StatsError extends MqMetricsError {
  declare readonly code: StatsErrorCode
  readonly statusCode = 400
  constructor(code: StatsErrorCode, message: string) {
    super(code, message)
    this.name = 'StatsError'
  }
}

const ALLOWED_VIEWS = `allowed views: ${STATS_VIEWS.join(', ')}`

export function isStatsView(view: unknown): view is StatsView {
  return typeof view === 'string' && (STATS_VIEWS as readonly string[]).includes(view)
}

/** A view as planned: each of its long lists a Listing (json.ts), written a topic at a time over HTTP. */
export type Planned<V> = { [K in keyof V]: V[K] extends readonly (infer T)[] ? V[K] | Listing<any, T> : V[K] }

/** A view and its narrowing, checked: what statsViewOf() builds from a context. */
export interface StatsRequest {
  view: StatsView
  narrow: Narrow
}

/**
 * Checks a `surface.stats(view, filter)` call before anything is read (a snapshot and a
 * conservation check cost a scrape and may raise faults; a refused call must change nothing).
 * Throws StatsError for a missing or unknown view or a bad filter, TypeError for a view that is
 * not a string.
 */
export function statsRequest(view: unknown, filter: unknown): StatsRequest {
  if (view === undefined) throw new StatsError('MISSING_FILTER', `a view is required, e.g. stats('topics'); ${ALLOWED_VIEWS}`)
  // A bad type is a TypeError (docs/errors.md): ['topics'] is not an unknown view "topics".
  if (typeof view !== 'string') throw new TypeError(`stats view must be a string (${STATS_VIEWS.join(', ')}), got ${describe(view)}`)
  if (!isStatsView(view)) {
    throw new StatsError('INVALID_FILTER', `unknown view ${JSON.stringify(String(view))}; ${ALLOWED_VIEWS}`)
  }
  return { view, narrow: checkFilter(filter) }
}

/** The /stats object for one view. Throws StatsError for an unknown view or a bad filter. */
export function statsView(view: string, filter: StatsFilter, ctx: StatsContext): StatsViews[StatsView] {
  return statsViewOf(statsRequest(view, filter), ctx)
}

/** The /stats object for a request statsRequest() checked. */
export function statsViewOf(request: StatsRequest, ctx: StatsContext): StatsViews[StatsView] {
  return materialize(statsPlanOf(request, ctx)) as StatsViews[StatsView]
}

/**
 * statsViewOf() with its long lists (a topic's entries each) not built yet: /stats over HTTP
 * builds and writes them a few topics at a time (json.ts toJSONSliced), so a large view never
 * holds the broker's thread for its whole write.
 */
export function statsPlanOf({ view, narrow }: StatsRequest, ctx: StatsContext): Planned<StatsViews[StatsView]> {
  switch (view) {
    case 'topics':
      return topicsView(ctx.snapshot, narrow)
    case 'partitions':
      return partitionsView(ctx.snapshot, narrow)
    case 'groups':
      return groupsView(ctx.snapshot, narrow)
    case 'quorum':
      return quorumView(ctx.snapshot)
    case 'latency':
      return latencyView(ctx)
    case 'conservation':
      return conservationView(ctx.conservation, narrow)
    case 'faults':
      return { filter: 'faults' as const, capacity: ctx.faults.capacity, counts: ctx.faults.counts, recent: ctx.faults.recent, total: ctx.faults.total }
    case 'collisions':
      return collisionsView(ctx.snapshot, narrow)
    case 'config':
      return configView(ctx)
  }
}

/**
 * `/stats` from its query string: validates first, and only then builds the context (a snapshot
 * and a conservation check cost a scrape; a bad request must not pay for one). The body is the
 * view, its lists built.
 */
export function statsFromQuery(query: URLSearchParams, makeContext: () => StatsContext): { statusCode: number; body: unknown } {
  return answered(() => {
    const { view, filter } = parseQuery(query)
    return statsView(view, filter, makeContext())
  })
}

/**
 * statsFromQuery() answered asynchronously (/stats over HTTP): a bad query is answered at once,
 * before anything is read; a good one by `answer`, with its body: the view as planned (statsPlanOf,
 * its lists built as it is written), or the view's JSON already written (a Buffer: the scrape
 * thread's, docs/scrape-thread.md).
 */
export function statsFromQueryLater(query: URLSearchParams, answer: (request: StatsRequest) => Promise<unknown>): { statusCode: number; body: unknown } | Promise<{ statusCode: number; body: unknown }> {
  let request: StatsRequest | undefined
  const refused = answered(() => {
    const { view, filter } = parseQuery(query)
    request = statsRequest(view, filter)
  })
  if (request === undefined) return refused
  return answer(request).then((body) => ({ statusCode: 200, body }))
}

/**
 * The views the scrape thread builds for /stats over HTTP (docs/scrape-thread.md): the large ones,
 * read from the snapshot and the conservation report alone. The others are small, and two of them
 * hold what only the main thread has (its fault log; where its backend came from).
 */
export const THREAD_VIEWS: ReadonlySet<StatsView> = new Set<StatsView>(['topics', 'partitions', 'groups', 'conservation', 'collisions'])

/** 200 with what `make` returns, or the StatsError it throws as its status and JSON error. */
function answered(make: () => unknown): { statusCode: number; body: unknown } {
  try {
    return { statusCode: 200, body: make() }
  } catch (error) {
    if (error instanceof StatsError) {
      return { statusCode: error.statusCode, body: { error: { code: error.code, message: error.message } } }
    }
    throw error
  }
}

function parseQuery(query: URLSearchParams): { view: string; filter: StatsFilter } {
  for (const key of new Set(query.keys())) {
    if (!(STATS_PARAMS as readonly string[]).includes(key)) {
      throw new StatsError('INVALID_QUERY', `unknown query parameter ${JSON.stringify(key)}; allowed parameters: ${STATS_PARAMS.join(', ')}`)
    }
  }
  const views = query.getAll('filter')
  if (views.length === 0 || (views.length === 1 && views[0] === '')) {
    throw new StatsError('MISSING_FILTER', `the filter query parameter is required, e.g. /stats?filter=topics; ${ALLOWED_VIEWS}`)
  }
  if (views.length > 1) {
    throw new StatsError('INVALID_FILTER', `filter must be given once, got ${views.length} values; ${ALLOWED_VIEWS}`)
  }
  if (!isStatsView(views[0])) {
    throw new StatsError('INVALID_FILTER', `unknown view ${JSON.stringify(views[0])}; ${ALLOWED_VIEWS}`)
  }
  const filter: StatsFilter = {}
  for (const key of ['topic', 'group'] as const) {
    const values = query.getAll(key)
    if (values.length > 1) throw new StatsError('INVALID_QUERY', `${key} must be given at most once, got ${values.length} values`)
    if (values.length === 1) {
      filter[key] = checkFilterName(key, values[0])
    }
  }
  return { view: views[0], filter }
}

/**
 * A topic or group filter is a name one can have (design §3.6): '' or one past the longest name
 * could match nothing, and is refused as a mistake, the same from the query and from stats().
 */
function checkFilterName(key: 'topic' | 'group', name: string): string {
  if (name === '') throw new StatsError('INVALID_QUERY', `${key} must be a non-empty ${key} name`)
  if (name.length > MAX_NAME_LENGTH) throw new StatsError('INVALID_QUERY', `${key} must be at most ${MAX_NAME_LENGTH} characters long, as a ${key} name is (UTF-16 code units), got ${name.length}`)
  return name
}

export interface Narrow {
  topic: string | undefined
  group: string | undefined
}

function checkFilter(filter: unknown): Narrow {
  if (filter === undefined || filter === null) return { topic: undefined, group: undefined }
  // A bad type is a TypeError (docs/errors.md), as a bad view's; an unknown key is the query's INVALID_QUERY.
  if (!isPlainObject(filter)) throw new TypeError(`stats filter must be an object { topic?, group? }, got ${describe(filter)}`)
  for (const key of Object.keys(filter)) {
    // A typo (`topics`) must not quietly show every topic: the HTTP query rejects it as well.
    if (key !== 'topic' && key !== 'group') throw new StatsError('INVALID_QUERY', `unknown stats filter key ${JSON.stringify(key)} (known: topic, group)`)
  }
  const topic = ownOption(filter, 'topic')
  const group = ownOption(filter, 'group')
  for (const [key, value] of [['topic', topic], ['group', group]] as const) {
    if (value !== undefined && typeof value !== 'string') throw new TypeError(`stats filter ${key} must be a string (an exact raw name), got ${describe(value)}`)
    if (value !== undefined) checkFilterName(key, value)
  }
  return { topic: topic as string | undefined, group: group as string | undefined }
}

/** The topics a per-topic view shows: exact raw topic name, and (with group=) having that group. */
function selectTopics(snapshot: Snapshot, narrow: Narrow): TopicSnapshot[] {
  return snapshot.topics.filter(
    (t) => (narrow.topic === undefined || t.name === narrow.topic) && (narrow.group === undefined || t.groups.some((g) => g.name === narrow.group)),
  )
}

function topicsView(snapshot: Snapshot, narrow: Narrow): Planned<TopicsView> {
  const topics = selectTopics(snapshot, narrow)
  const totals: Record<'produced' | 'delivered' | 'dropped' | 'dlq' | 'bytes', Count> = { produced: 0, delivered: 0, dropped: 0, dlq: 0, bytes: 0 }
  for (const t of topics) {
    for (const key of ['produced', 'delivered', 'dropped', 'dlq', 'bytes'] as const) totals[key] = addCount(totals[key], t[key])
  }
  return {
    filter: 'topics',
    topics: new Listing(topics, (t) => [{
      topic: t.name,
      label: t.label,
      produced: t.produced,
      delivered: t.delivered,
      dropped: t.dropped,
      dlq: t.dlq,
      bytes: t.bytes,
      partitions: t.partitionNumbers.length,
      groups: t.groups.length,
    }]),
    // Summed over the topics listed above (mq-stats' default view reads these).
    totals,
  }
}

function partitionsView(snapshot: Snapshot, narrow: Narrow): Planned<PartitionsView> {
  const partitions = new Listing(selectTopics(snapshot, narrow), (t) =>
    t.partitionNumbers.map((partition, p) => ({ topic: t.name, label: t.label, partition, last_seq: t.lastSeq[p], depth: t.depth[p] })),
  )
  return { filter: 'partitions', partitions }
}

function groupsView(snapshot: Snapshot, narrow: Narrow): Planned<GroupsView> {
  const groups = new Listing(selectTopics(snapshot, narrow), (t) =>
    t.groups
      .filter((g) => narrow.group === undefined || g.name === narrow.group)
      .map((g) => {
        const ackFloors: Record<string, number> = {}
        t.partitionNumbers.forEach((partition, p) => (ackFloors[String(partition)] = g.ackFloors?.[p] ?? 0))
        return {
          topic: t.name,
          topic_label: t.label,
          group: g.name,
          label: g.label,
          delivered: g.delivered,
          dropped: g.dropped,
          dlq: g.dlq,
          retries: g.retries,
          in_flight: g.inFlight,
          max_in_flight: g.maxInFlight,
          lag: g.lag,
          depth: g.depth,
          ack_floors: ackFloors,
        }
      }),
  )
  return { filter: 'groups', groups }
}

function quorumView(snapshot: Snapshot): QuorumView {
  const state = snapshot.quorumState
  return {
    filter: 'quorum',
    quorum_state: state,
    status: TIER_NAMES[state],
    runbook_level: RUNBOOK_LEVELS[state],
    replicas: snapshot.replicas,
    in_sync: snapshot.inSync,
    lagging: snapshot.lagging,
    leader_epoch: snapshot.leaderEpoch,
    // Beyond design §7's minimum: mq-stats' default view shows these beside the tier.
    connections: snapshot.connections,
    uptime_seconds: snapshot.uptimeSeconds,
  }
}

function latencyView(ctx: StatsContext): LatencyView {
  const window = ctx.snapshot.latency
  return {
    filter: 'latency',
    enabled: ctx.config.e2e_latency,
    p50: window?.p50 ?? null,
    p90: window?.p90 ?? null,
    p99: window?.p99 ?? null,
    count: window?.count ?? 0,
  }
}

function conservationView(report: ConservationReport, narrow: Narrow): Planned<ConservationView> {
  const topics = new Listing(report.topics.filter((t) => narrow.topic === undefined || t.topic === narrow.topic), (t) => narrowedGroups(t, narrow))
  return { filter: 'conservation', topics }
}

/** A conservation topic as `narrow`'s group filter shows it: none, when it has no such group. */
function narrowedGroups(t: ConservationTopic, narrow: Narrow): ConservationTopic[] {
  if (narrow.group === undefined) return [t]
  const groups = t.groups.filter((g) => g.group === narrow.group)
  return groups.length > 0 ? [{ ...t, groups }] : []
}

/**
 * A conservation view the scrape thread wrote without some of its topics, for the main thread to
 * read again between its tasks (docs/scrape-thread.md). The JSON is the view's prefix, runs of
 * topics and its end: `start` is where the first run begins, `cuts[i]` where the i-th topic held
 * back goes (the end of a run, the next run beginning there), `end` where the last run ends. The
 * topics of a run are joined by commas; two runs are not.
 */
export interface HeldBack {
  start: number
  cuts: Float64Array
  end: number
  /** The ids of the topics held back (the incarnations read), in order. */
  topics: Float64Array
}

/**
 * `view`'s JSON with the topics `held` picks left out (HeldBack), or undefined when it picks none.
 * `idOf` gives a held topic's id (the incarnation read).
 */
export function conservationHeldBack(view: ConservationView, held: (t: ConservationTopic) => boolean, idOf: (name: string) => number): { text: string; back: HeldBack } | undefined {
  if (!view.topics.some(held)) return undefined
  const empty = toJSON({ ...view, topics: [] })
  if (!empty.endsWith('[]}')) throw new Error(`a conservation view's JSON must end with its topics, got ${empty}`)
  const prefix = empty.slice(0, -2)
  const parts = [prefix]
  const cuts: number[] = []
  const ids: number[] = []
  const start = Buffer.byteLength(prefix, 'utf8')
  let at = start
  let run = 0 // topics in the run under way
  for (const t of view.topics) {
    if (held(t)) {
      cuts.push(at)
      ids.push(idOf(t.topic))
      run = 0
      continue
    }
    const text = (run++ === 0 ? '' : ',') + toJSON(t)
    parts.push(text)
    at += Buffer.byteLength(text, 'utf8')
  }
  parts.push(']}')
  // Typed arrays: moved to the main thread with the JSON, not cloned an object at a time.
  return { text: parts.join(''), back: { start, cuts: Float64Array.from(cuts), end: at, topics: Float64Array.from(ids) } }
}

/**
 * The whole view from the JSON conservationHeldBack() wrote and the topics held back as the main
 * thread read them again, added one at a time in order (undefined for one removed since), shown
 * as `narrow` asks. Each add() writes what it can at once, so the work is spread over the slices
 * of the read; the thread's JSON is not copied but in small parts (ChunkWriter).
 */
export class ConservationFill {
  readonly #json: Buffer
  readonly #back: HeldBack
  readonly #narrow: Narrow
  readonly #out = new ChunkWriter()
  /** How many held topics were added; where the thread's JSON not written yet begins. */
  #added = 0
  #from: number
  /** Whether the topics array has an item written yet (the next is preceded by a comma). */
  #any = false

  constructor(json: Buffer, back: HeldBack, narrow: Narrow) {
    this.#json = json
    this.#back = back
    this.#narrow = narrow
    this.#from = back.start
    this.#out.bytes(json.subarray(0, back.start))
  }

  add(topic: ConservationTopic | undefined): void {
    if (this.#added === this.#back.cuts.length) throw new Error('every topic held back was added already')
    this.#run(this.#back.cuts[this.#added++])
    if (topic !== undefined) for (const shown of narrowedGroups(topic, this.#narrow)) this.#out.text((this.#any ? ',' : '') + toJSON(shown)), (this.#any = true)
  }

  finish(): JsonChunks {
    if (this.#added !== this.#back.cuts.length) throw new Error(`${this.#back.cuts.length - this.#added} topics held back were not added`)
    this.#run(this.#back.end)
    this.#out.bytes(this.#json.subarray(this.#back.end))
    return this.#out.finish()
  }

  /** The thread's topics up to `to`. */
  #run(to: number): void {
    if (to === this.#from) return
    if (this.#any) this.#out.text(',')
    this.#out.bytes(this.#json.subarray(this.#from, to))
    this.#from = to
    this.#any = true
  }
}

/**
 * design §3.5: raw names that share one label value, and so one series on /metrics — live names,
 * and what removed ones still add to it (a label with one live name and a removed share is listed
 * too: its series is more than that name's own numbers).
 */
function collisionsView(snapshot: Snapshot, narrow: Narrow): CollisionsView {
  const topicNames = new Map<string, { names: string[]; carried?: Carried }>()
  const groupNames = new Map<string, { topic_label: string; label: string; names: { topic: string; group: string }[]; removed_retries?: Count }>()
  for (const t of snapshot.topics) {
    const entry = topicNames.get(t.label) ?? { names: [] }
    entry.names.push(t.name)
    // Only a removed topic's share makes a one-name label a collision: retries carried for a
    // removed group whose name collided with a live one's are the group's (removed_retries below).
    if (t.carried !== undefined && topicShare(t.carried)) entry.carried = t.carried
    topicNames.set(t.label, entry)
    for (const g of t.groups) {
      const id = JSON.stringify([t.label, g.label])
      const group = groupNames.get(id) ?? { topic_label: t.label, label: g.label, names: [] }
      group.names.push({ topic: t.name, group: g.name })
      groupNames.set(id, group)
    }
  }
  for (const t of snapshot.topics) {
    for (const [groupLabel, retries] of t.carried?.retries ?? []) {
      const group = groupNames.get(JSON.stringify([t.label, groupLabel]))
      if (group !== undefined) group.removed_retries = retries
    }
  }
  const byLabel = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0)
  const topics = [...topicNames]
    .filter(([, { names, carried }]) => (names.length >= 2 || carried !== undefined) && narrow.group === undefined && (narrow.topic === undefined || names.includes(narrow.topic)))
    .map(([label, { names, carried }]) => ({ label, names: [...names].sort(byLabel), ...(carried === undefined ? {} : { removed: removedShare(carried) }) }))
    .sort((a, b) => byLabel(a.label, b.label))
  const groups = [...groupNames.values()]
    .filter(
      (e) =>
        (e.names.length >= 2 || e.removed_retries !== undefined) &&
        e.names.some((n) => (narrow.topic === undefined || n.topic === narrow.topic) && (narrow.group === undefined || n.group === narrow.group)),
    )
    .map((e) => ({ ...e, names: [...e.names].sort((a, b) => byLabel(a.topic, b.topic) || byLabel(a.group, b.group)) }))
    .sort((a, b) => byLabel(a.topic_label, b.topic_label) || byLabel(a.label, b.label))
  return { filter: 'collisions', topics, groups }
}

/** Whether removed topics of a label still add counts or a last_seq to its series. */
function topicShare(c: Carried): boolean {
  return c.lastSeq.size > 0 || [c.produced, c.bytes, c.delivered, c.dropped, c.dlq].some((n) => n !== 0 && n !== 0n)
}

function removedShare(carried: Carried): RemovedShare {
  const lastSeq: Record<string, number> = {}
  for (const partition of [...carried.lastSeq.keys()].sort((a, b) => a - b)) lastSeq[String(partition)] = carried.lastSeq.get(partition)!
  return { produced: carried.produced, delivered: carried.delivered, dropped: carried.dropped, dlq: carried.dlq, bytes: carried.bytes, last_seq: lastSeq }
}

function configView(ctx: StatsContext): ConfigView {
  const c = ctx.config
  return {
    filter: 'config',
    metrics_enabled: c.metrics_enabled,
    max_in_flight: c.max_in_flight,
    max_attempts: c.max_attempts,
    e2e_latency: c.e2e_latency,
    e2e_latency_timer: c.e2e_latency_timer,
    // design §7: the token itself is never shown.
    metrics_auth_token: c.metrics_auth_token === undefined ? 'unset' : 'set',
    max_topics: c.max_topics,
    max_partitions_per_topic: c.max_partitions_per_topic,
    max_groups_per_topic: c.max_groups_per_topic,
    backend: ctx.backend,
    backend_reason: ctx.backendReason,
  }
}
