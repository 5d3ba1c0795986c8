// One error class per kind, each with a stable `code` (STYLE: Errors), all under one base class.
// HTTP error bodies reuse the same codes. Every code is listed in docs/errors.md.

/** UsageError's codes: a call that contradicts how the handle (or the surface) is used. */
export type UsageErrorCode = 'IN_FLIGHT_KEPT_BY_SEND' | 'FLOOR_KEPT_BY_SETTLE' | 'ALREADY_LISTENING' | 'METRICS_DISABLED'
/** FatalInvariantError's codes: a partition's seqs that do not continue its last_seq. */
export type FatalInvariantCode = 'SEQ_REGRESSION' | 'SEQ_GAP'
/** StatsError's codes (a bad `/stats` request or `stats()` call). */
export type StatsErrorCode = 'MISSING_FILTER' | 'INVALID_FILTER' | 'INVALID_QUERY'
/** Every code the library's own errors carry (docs/errors.md); an application's subclass of MqMetricsError may add its own. */
export type ErrorCode = UsageErrorCode | FatalInvariantCode | StatsErrorCode | 'CONFIG_INVALID' | 'TOPIC_REMOVED' | 'GROUP_REMOVED' | 'SURFACE_CLOSED' | 'LIMIT_REACHED'
  // Internal (docs/errors.md): a scrape whose client left before its turn; one the scrape thread could not render.
  | 'SCRAPE_ABANDONED' | 'SCRAPE_THREAD_ERROR'

/**
 * Every error this library throws: `code` is stable, the message is for people. Each class narrows
 * `code` to its own codes (ErrorCode is all of them); the base takes any string, so that an
 * application may derive errors of its own from it.
 */
export class MqMetricsError extends Error {
  readonly code: string
  constructor(code: string, message: string) {
    super(message)
    this.name = 'MqMetricsError'
    this.code = code
  }
}

/**
 * A call that contradicts how the handle is used (two ways of keeping one floor): refused before
 * anything changes, because the numbers would silently stop adding up.
 */
export class UsageError extends MqMetricsError {
  declare readonly code: UsageErrorCode
  constructor(code: UsageErrorCode, message: string) {
    super(code, message)
    this.name = 'UsageError'
  }
}

/** Bad configuration or environment at startup: names the key (or variable) at fault. */
export class ConfigError extends MqMetricsError {
  declare readonly code: 'CONFIG_INVALID'
  readonly key: string
  constructor(key: string, message: string) {
    super('CONFIG_INVALID', `${key}: ${message}`)
    this.name = 'ConfigError'
    this.key = key
  }
}

/** design §5: an invariant whose violation means the broker's own state is corrupt. */
export class FatalInvariantError extends MqMetricsError {
  readonly metric: string
  readonly labels: Record<string, string>
  /** The raw topic name `labels.topic` was sanitized from (a fault's `names`). */
  readonly names: { topic: string }
  readonly previous: number
  readonly attempted: number
  declare readonly code: FatalInvariantCode
  constructor(code: FatalInvariantCode, metric: string, labels: Record<string, string>, names: { topic: string }, previous: number, attempted: number, detail?: string) {
    super(code, `${code}: ${metric}${formatLabels(labels)} ${detail ?? `would decrease from ${previous} to ${attempted}`}`)
    this.name = 'FatalInvariantError'
    this.metric = metric
    this.labels = labels
    this.names = names
    this.previous = previous
    this.attempted = attempted
  }
}

/** A handle used after its topic was removed with `surface.removeTopic()`. */
export class RemovedTopicError extends MqMetricsError {
  declare readonly code: 'TOPIC_REMOVED'
  constructor(topic: string) {
    super('TOPIC_REMOVED', `topic ${JSON.stringify(topic)} was removed: this handle counts nothing more (surface.topic() registers a new topic of that name, which starts from zero)`)
    this.name = 'RemovedTopicError'
  }
}

/** A group handle used after its group was removed with `topic.removeGroup()`. */
export class RemovedGroupError extends MqMetricsError {
  declare readonly code: 'GROUP_REMOVED'
  constructor(topic: string, group: string) {
    super('GROUP_REMOVED', `group ${JSON.stringify(group)} of topic ${JSON.stringify(topic)} was removed: this handle counts nothing more, a late settlement included (topic.group() registers a new group of that name, which starts from zero)`)
    this.name = 'RemovedGroupError'
  }
}

/** The surface (or the recorder of a worker) was used after `close()`. */
export class ClosedError extends MqMetricsError {
  declare readonly code: 'SURFACE_CLOSED'
  constructor(what: string) {
    super('SURFACE_CLOSED', `${what} is closed: it records and reads nothing more; create a new surface with createSurface()`)
    this.name = 'ClosedError'
  }
}

/** A cardinality cap of the configuration (max_topics, max_partitions_per_topic, max_groups_per_topic) would be passed, or the memory registrations take is full: nothing is registered. */
export class LimitError extends MqMetricsError {
  declare readonly code: 'LIMIT_REACHED'
  /** The configuration key whose cap was reached; `registration_log`: the log every registration is written to is full; `counter_memory`: the memory that holds every registration's cells is. */
  readonly limit: 'max_topics' | 'max_partitions_per_topic' | 'max_groups_per_topic' | 'registration_log' | 'counter_memory'
  constructor(limit: LimitError['limit'], message: string) {
    super('LIMIT_REACHED', message)
    this.name = 'LimitError'
    this.limit = limit
  }
}

function formatLabels(labels: Record<string, string>): string {
  const parts = Object.entries(labels).map(([k, v]) => `${k}=${JSON.stringify(v)}`)
  return parts.length ? `{${parts.join(',')}}` : ''
}
