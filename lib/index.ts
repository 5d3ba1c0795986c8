// The public API (design §12) and nothing else: internals are not re-exported.
import { Config } from './core/config'
import { SurfaceOptions } from './http/options'
import { Surface } from './surface'
import { SharedSurface, WorkerRecorder } from './worker'

export { METRICS_CONTENT_TYPE } from './exposition/allowlist'
export { MqMetricsError, ConfigError, FatalInvariantError, RemovedTopicError, RemovedGroupError, ClosedError, UsageError, LimitError } from './core/errors'
export { FOLLOWER_LAG, READ_ONLY_DEGRADED } from './core/quorum'
export { StatsError } from './exposition/stats'
export type { StatsErrorCode, StatsView, StatsViews, TopicsView, PartitionsView, GroupsView, QuorumView, LatencyView, ConservationView, FaultsView, CollisionsView, RemovedShare, ConfigView } from './exposition/stats'
export type { WriteAnswer, QuorumEvent } from './core/quorum'
export type { Config, ResolvedConfig } from './core/config'
export type { ErrorCode, UsageErrorCode, FatalInvariantCode } from './core/errors'
export type { BackendName } from './core/backend'
export type { ScrapeThreadState } from './scrape/thread'
export type { ArenaUsage } from './core/registry'
export type { SurfaceOptions, ResolvedSurfaceOptions } from './http/options'
export type { FaultRecord, FaultCode, FaultNames } from './core/faults'
export type { Topic, GroupOptions, GroupStart } from './core/topic'
export type { Group, Outcome } from './core/group'
export type { Surface, Listening, ListenOptions } from './surface'
export type { SharedSurface, WorkerRecorder } from './worker'
export type { LatencyEstimator } from './core/latency'
export type { Snapshot, SnapshotWithPartitions, TopicSnapshot, GroupSnapshot, PartitionSnapshot, Count, QuorumState, LatencyQuantiles } from './core/snapshot'

/**
 * Reads the configuration once (throws ConfigError) and returns the live surface. `options` (not
 * broker configuration: nothing in /stats?filter=config) tunes how /metrics shares the main thread.
 */
export function createSurface(config?: Config, options?: SurfaceOptions): Surface {
  return new Surface(config, options)
}

/** In a worker thread: records into the surface whose `share()` result was posted here. */
export function attachSurface(shared: SharedSurface): WorkerRecorder {
  return new WorkerRecorder(shared)
}
