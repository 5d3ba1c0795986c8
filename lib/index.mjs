// ESM entry: the CommonJS build re-exported under named bindings.
import cjs from './index.js'

export const {
  createSurface, attachSurface, METRICS_CONTENT_TYPE, ConfigError, FatalInvariantError,
  RemovedTopicError, ClosedError, StatsError, FOLLOWER_LAG, READ_ONLY_DEGRADED,
  MqMetricsError, RemovedGroupError, UsageError, LimitError,
} = cjs
export default cjs
