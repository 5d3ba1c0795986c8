// design §2: the closed allowlist — exactly these 15 families, in this order, and nothing else.
// The single source that the renderer, the tests and the docs read.

export type MetricType = 'gauge' | 'counter'

export interface MetricDefinition {
  readonly name: string
  readonly type: MetricType
  /** Label names in the order they appear in every sample of the family. */
  readonly labels: readonly string[]
  /** One line of ASCII; escaped with escapeHelp (design §3.3) when rendered. */
  readonly help: string
}

/** design §2: the content type of the /metrics body (text exposition format 0.0.4). */
export const METRICS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8'

function define(name: string, type: MetricType, labels: readonly string[], help: string): MetricDefinition {
  return Object.freeze({ name, type, labels: Object.freeze([...labels]), help })
}

export const METRICS: readonly MetricDefinition[] = Object.freeze([
  define('mq_broker_uptime_seconds', 'gauge', [], 'Broker process uptime in seconds.'),
  define('mq_connections', 'gauge', [], 'Currently active client connections.'),
  define('mq_leader_epoch', 'gauge', [], 'Current leader epoch; it only increases.'),
  define('mq_quorum_state', 'gauge', [], 'Replication quorum state: 0 healthy, 1 soft, 2 read_only.'),
  define('mq_topic_messages_produced_total', 'counter', ['topic'], 'Messages durably appended to the topic by a publish.'),
  define('mq_topic_messages_delivered_total', 'counter', ['topic'], 'Acknowledged successful deliveries of messages of the topic, summed over its consumer groups.'),
  define('mq_topic_messages_dropped_total', 'counter', ['topic'], 'Messages of the topic given up on (retries exhausted, expired, discarded), summed over its consumer groups, whether or not the DLQ write succeeded.'),
  define('mq_topic_messages_dlq_total', 'counter', ['topic'], 'Dropped messages of the topic that were successfully written to the dead-letter queue.'),
  define('mq_topic_bytes_total', 'counter', ['topic'], 'Bytes of the topic appended to disk.'),
  define('mq_partition_depth', 'gauge', ['topic', 'partition'], 'Unconsumed messages in the partition: the most any group still owes (last_seq minus its ack floor, less what it settled above the floor).'),
  define('mq_partition_last_seq', 'gauge', ['topic', 'partition'], 'Latest durable sequence number of the partition; it never decreases.'),
  define('mq_group_lag', 'gauge', ['topic', 'group'], 'Largest distance from last_seq to the consumer group\'s ack floor over the topic\'s partitions (a message settled above the floor counts until the floor passes it).'),
  define('mq_group_in_flight', 'gauge', ['topic', 'group'], 'Messages dispatched to the consumer group and not yet acknowledged or dropped.'),
  define('mq_group_retries_total', 'counter', ['topic', 'group'], 'Redeliveries of messages to the consumer group.'),
  define('mq_e2e_latency_ms', 'gauge', ['quantile'], 'Publish-to-acknowledgement latency in milliseconds over the last 60 s window, by quantile.'),
])
