// One error class per kind, each with a stable `code` (STYLE: Errors). HTTP error bodies reuse
// the same codes.

/** Bad configuration or environment at startup: names the key (or variable) at fault. */
export class ConfigError extends Error {
  readonly code = 'CONFIG_INVALID'
  readonly key: string
  constructor(key: string, message: string) {
    super(`${key}: ${message}`)
    this.name = 'ConfigError'
    this.key = key
  }
}

/** design §5: an invariant whose violation means the broker's own state is corrupt. */
export class FatalInvariantError extends Error {
  readonly code: string
  readonly metric: string
  readonly labels: Record<string, string>
  readonly previous: number
  readonly attempted: number
  constructor(code: string, metric: string, labels: Record<string, string>, previous: number, attempted: number, detail?: string) {
    super(`${code}: ${metric}${formatLabels(labels)} ${detail ?? `would decrease from ${previous} to ${attempted}`}`)
    this.name = 'FatalInvariantError'
    this.code = code
    this.metric = metric
    this.labels = labels
    this.previous = previous
    this.attempted = attempted
  }
}

/** A handle used after its topic was removed with `surface.removeTopic()`. */
export class RemovedTopicError extends Error {
  readonly code = 'TOPIC_REMOVED'
  constructor(topic: string) {
    super(`topic ${JSON.stringify(topic)} was removed; resolve a new handle with surface.topic()`)
    this.name = 'RemovedTopicError'
  }
}

/** A group handle used after its group was removed with `topic.removeGroup()`. */
export class RemovedGroupError extends Error {
  readonly code = 'GROUP_REMOVED'
  constructor(topic: string, group: string) {
    super(`group ${JSON.stringify(group)} of topic ${JSON.stringify(topic)} was removed; resolve a new handle with topic.group()`)
    this.name = 'RemovedGroupError'
  }
}

/** The surface (or the recorder of a worker) was used after `close()`. */
export class ClosedError extends Error {
  readonly code = 'SURFACE_CLOSED'
  constructor(what: string) {
    super(`${what} is closed`)
    this.name = 'ClosedError'
  }
}

function formatLabels(labels: Record<string, string>): string {
  const parts = Object.entries(labels).map(([k, v]) => `${k}=${JSON.stringify(v)}`)
  return parts.length ? `{${parts.join(',')}}` : ''
}
