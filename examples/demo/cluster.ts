// `mq-demo --nodes 3` (docs/cluster.md): a cluster of simulated broker nodes in one process, each
// with its own surface and port, as a real cluster's nodes would each link the library in.
//
// The model is a replicated log with one leader: the leader takes every write (append, then
// dispatch and settle per message to two consumer groups per topic) and replicates to the
// followers it can reach. Every 250 ms each node runs replicationRound() with what it really sees:
// itself plus the peers it can reach, so an isolated node goes read_only while the majority stays
// writable. When the leader cannot be reached by a majority, the majority elects the lowest node
// id it has, with an epoch one higher than any it knows; a node that comes back learns the newer
// epoch and follows. A follower serves no topics (its series leave when it steps down); a new
// leader carries each partition's log on from the cluster's last seq (its first append starts
// above 1: a resumed log). Conservation holds on every node at every quiet moment.
//
// Scenarios (one cycle of `4 × phase` seconds, repeated):
//   steady     nothing happens;
//   partition  the leader is cut off (read_only; the others elect a new leader), then heals;
//   failover   the leader's process dies (its endpoint goes down; a new leader is elected), then
//              it restarts as a follower with a fresh surface.
import { createSurface } from 'mq-metrics'
import { UsageError, scanFlags } from './flags'
import { onStop } from './stop'
import type { FaultRecord, Group, Listening, QuorumEvent, Surface, Topic } from 'mq-metrics'

const TIERS = ['healthy', 'soft', 'read_only']

export const CLUSTER_SCENARIOS = ['steady', 'partition', 'failover'] as const
export type ClusterScenario = (typeof CLUSTER_SCENARIOS)[number]

const ROUND_MS = 250
const TICK_MS = 20
const PARTITIONS = 2
const GROUPS = ['billing', 'analytics']
const TOPIC_NAMES = ['orders', 'payments', 'shipments', 'inventory', 'notifications', 'audit']

export interface ClusterOptions {
  nodes: number
  /** The first node's port; node i listens on port + i (0: every node on a free port). */
  port: number
  host: string
  topics: number
  /** Messages per second the leader takes, over all topics. */
  rate: number
  scenario: ClusterScenario
  /** Seconds per phase of the scenario's cycle; 'manual': no timer, Cluster.advance() moves it (tests). */
  phase: number | 'manual'
  /** Where the addresses, the scrape config and the events go. */
  line: (text: string) => void
}

/** One consumer group's books on the leader: what it sent and has not settled, by partition. */
interface Consumer {
  group: Group
  next: number[] // next seq to send, by partition
  inFlight: { partition: number; seq: number; at: number; sent: number; attempts: number }[]
}

class Node {
  readonly id: string
  port: number
  surface: Surface | undefined
  server: Listening | undefined
  alive = true
  isolated = false
  epoch = 0
  leads = false
  topics: { topic: Topic; consumers: Consumer[] }[] = []

  constructor(index: number, port: number) {
    this.id = `node-${index + 1}`
    this.port = port
  }
}

export interface Cluster {
  readonly nodes: readonly { id: string; url: string; alive: boolean; isolated: boolean; leads: boolean; epoch: number; surface: Surface | undefined }[]
  /** Every live node's conservation residuals are 0 (the demo's own check, for tests). */
  residuals(): { node: string; topic: string; group: string; residual: number | bigint | null }[]
  /** Moves the scenario to its next phase now (what the phase timer does; with phase 'manual', only this). */
  advance(): Promise<void>
  stop(): Promise<void>
}

export async function runCluster(options: ClusterOptions): Promise<Cluster> {
  const nodes = Array.from({ length: options.nodes }, (_, i) => new Node(i, options.port === 0 ? 0 : options.port + i))
  const names = Array.from({ length: options.topics }, (_, i) => (i < TOPIC_NAMES.length ? TOPIC_NAMES[i] : `topic-${i + 1}`))
  /** The replicated log: each partition's last seq, as far as the cluster got. */
  const log = new Map<string, number[]>(names.map((name) => [name, new Array(PARTITIONS).fill(0)]))
  const started = Date.now()
  const seconds = () => ((Date.now() - started) / 1000).toFixed(1).padStart(6)
  const event = (text: string) => options.line(`${seconds()}s  ${text}`)
  let stopped = false

  async function boot(node: Node): Promise<void> {
    node.surface = createSurface({ max_in_flight: 10_000, e2e_latency: true })
    node.surface.setLeaderEpoch(node.epoch)
    node.surface.on('quorum', (change: QuorumEvent) => event(`${node.id}: quorum ${TIERS[change.from]} -> ${TIERS[change.to]} (${change.inSync} of ${change.replicas} in sync${change.lagging?.length ? `; lagging: ${change.lagging.join(', ')}` : ''})`))
    node.surface.on('fault', (fault: FaultRecord) => event(`${node.id}: FAULT ${fault.code} ${fault.metric} ${JSON.stringify(fault.labels)}`))
    node.server = await node.surface.listen({ port: node.port, host: options.host })
    node.port = node.server.port
    node.surface.connectionOpened() // the cluster link to its peers
  }

  const url = (node: Node) => `http://${options.host}:${node.port}`
  const reachable = (a: Node, b: Node) => a.alive && b.alive && !a.isolated && !b.isolated
  const majority = (count: number) => count * 2 > options.nodes

  /** A node starts leading: it serves every topic, carrying each partition's log on. */
  function lead(node: Node, epoch: number): void {
    node.leads = true
    node.surface!.setLeader(true)
    node.topics = names.map((name) => {
      const topic = node.surface!.topic(name)
      const last = log.get(name)!
      const consumers = GROUPS.map((g) => ({ group: topic.group(g, { from: 'latest' }), next: last.map((seq) => seq + 1), inFlight: [] }))
      return { topic, consumers }
    })
    node.surface!.connectionOpened() // the producers and consumers move to the leader
    node.surface!.connectionOpened()
    event(`${node.id} leads, epoch ${epoch}`)
  }

  /** A node stops leading: its topics leave (a follower serves none). */
  function stepDown(node: Node): void {
    if (!node.leads) return
    node.leads = false
    if (node.surface !== undefined) {
      node.surface.setLeader(false)
      for (const name of names) node.surface.removeTopic(name)
      node.surface.connectionClosed()
      node.surface.connectionClosed()
    }
    node.topics = []
  }

  /** Replication rounds and elections: what every node sees of the others. */
  function round(): void {
    for (const node of nodes) {
      if (!node.alive || node.surface === undefined) continue
      const lagging = nodes.filter((other) => other !== node && !reachable(node, other)).map((other) => other.id)
      node.surface.replicationRound({ replicas: options.nodes, inSync: options.nodes - lagging.length, lagging })
    }
    // The side with a majority: every live node that is not cut off (isolation is one node alone).
    const side = nodes.filter((n) => n.alive && !n.isolated)
    if (!majority(side.length)) return
    const top = Math.max(...nodes.filter((n) => n.alive).map((n) => n.epoch))
    const leader = side.find((n) => n.leads && n.epoch === top)
    if (leader === undefined) {
      const elected = side[0]
      const epoch = Math.max(...nodes.map((n) => n.epoch)) + 1
      for (const n of side) {
        if (n !== elected) stepDown(n)
        n.epoch = epoch
        n.surface!.setLeaderEpoch(epoch)
      }
      lead(elected, epoch)
    } else {
      // A node back on the majority's side learns the epoch and follows.
      for (const n of side) {
        if (n === leader || n.epoch === leader.epoch) continue
        stepDown(n)
        n.epoch = leader.epoch
        n.surface!.setLeaderEpoch(leader.epoch)
        event(`${n.id} follows ${leader.id}, epoch ${leader.epoch}`)
      }
    }
  }

  /** The leader's traffic for one tick: appends, sends, settlements; consumers on every node that leads. */
  let budget = 0
  function tick(): void {
    const now = Date.now()
    budget += (options.rate * TICK_MS) / 1000
    for (const node of nodes) {
      if (!node.leads || !node.alive || node.surface === undefined) continue
      // Only a leader that can write takes producers' messages (an isolated one is read_only).
      const writes = node.surface.admitWrite().ok && !node.isolated ? Math.floor(budget) : 0
      for (let i = 0; i < writes; i++) {
        const t = i % node.topics.length
        const p = Math.floor(i / node.topics.length) % PARTITIONS
        const name = names[t]
        const last = log.get(name)!
        const seq = node.topics[t].topic.produced(p, last[p] + 1, 256 + ((i * 37) % 768)) ? last[p] + 1 : 0
        if (seq !== 0) last[p] = seq
      }
      for (const { topic, consumers } of node.topics) {
        for (const c of consumers) consume(node.surface, topic, c, now)
      }
    }
    budget -= Math.floor(budget)
  }

  function consume(surface: Surface, topic: Topic, c: Consumer, now: number): void {
    // Settle what was sent at least 30 ms ago: 97% delivered, 2% retried (up to 3 attempts), 1% dropped.
    const keep: Consumer['inFlight'] = []
    for (const m of c.inFlight) {
      if (now - m.at < 30) {
        keep.push(m)
        continue
      }
      const roll = ((Math.imul(m.seq, 2654435761) + Math.imul(m.attempts, 40503)) >>> 0) % 100
      if (roll < 2 && m.attempts < 3) {
        c.group.redeliver(m.partition, m.seq)
        keep.push({ ...m, at: now, attempts: m.attempts + 1 })
      } else if (roll === 2) {
        c.group.settle(m.partition, m.seq, 'dropped')
        if (Math.floor(m.seq / 7) % 5 !== 0) c.group.deadLettered() // a DLQ write fails now and then
      } else {
        c.group.settle(m.partition, m.seq, 'delivered')
        surface.latency.record(now - m.sent + 1.5) // publish to ack: the time it waited, plus the broker's hop
      }
    }
    c.inFlight = keep
    for (let p = 0; p < PARTITIONS; p++) {
      const last = topic.lastSeq(p)
      while (c.next[p] <= last && c.inFlight.length < 500) {
        c.group.send(p, c.next[p])
        c.inFlight.push({ partition: p, seq: c.next[p], at: now, sent: now, attempts: 1 })
        c.next[p]++
      }
    }
  }

  /** The scenario's events, once per phase. */
  let phase = 0
  let victim: Node | undefined
  async function advance(): Promise<void> {
    const step = phase++ % 4
    if (options.scenario === 'steady') return
    if (step === 0) {
      victim = nodes.find((n) => n.leads && n.alive && !n.isolated)
      if (victim === undefined) return
      if (options.scenario === 'partition') {
        victim.isolated = true
        event(`partition: ${victim.id} is cut off from its peers`)
      } else {
        event(`failover: ${victim.id}'s process dies`)
        victim.alive = false
        stepDown(victim)
        const dying = victim.surface!
        victim.surface = undefined
        victim.server = undefined
        await dying.close()
      }
    } else if (step === 2 && victim !== undefined) {
      if (options.scenario === 'partition') {
        victim.isolated = false
        event(`partition heals: ${victim.id} reaches its peers again`)
      } else {
        victim.alive = true
        victim.epoch = 0 // a fresh process knows no epoch until its peers tell it
        await boot(victim)
        event(`failover: ${victim.id} restarts (a fresh surface) and will follow`)
      }
      victim = undefined
    }
  }

  for (const node of nodes) await boot(node)
  options.line(`mq-demo: a cluster of ${options.nodes} nodes, scenario ${options.scenario}, ${names.length} topics x ${PARTITIONS} partitions, ${options.rate} msg/s to the leader`)
  options.line(`mq-demo: ${nodes[0].surface!.backendReason}`)
  for (const node of nodes) options.line(`${node.id}  ${url(node)}/metrics`)
  options.line('Prometheus scrape config (docs/cluster.md):')
  options.line('  scrape_configs:')
  options.line('    - job_name: mq')
  options.line('      scrape_interval: 5s')
  options.line('      static_configs:')
  options.line(`        - targets: [${nodes.map((n) => `'${options.host}:${n.port}'`).join(', ')}]`)
  round()

  const timers = [
    setInterval(round, ROUND_MS),
    setInterval(tick, TICK_MS),
  ]
  const phaseLength = options.phase
  if (phaseLength !== 'manual') timers.push(setInterval(() => void advance().catch((error) => event(`scenario error: ${(error as Error).message}`)), phaseLength * 1000))

  return {
    get nodes() {
      return nodes.map((n) => ({ id: n.id, url: url(n), alive: n.alive, isolated: n.isolated, leads: n.leads, epoch: n.epoch, surface: n.surface }))
    },
    residuals() {
      const out: { node: string; topic: string; group: string; residual: number | bigint | null }[] = []
      for (const node of nodes) {
        if (node.surface === undefined) continue
        for (const t of node.surface.stats('conservation').topics) for (const g of t.groups) out.push({ node: node.id, topic: t.topic, group: g.group, residual: g.residual })
      }
      return out
    },
    advance,
    async stop() {
      if (stopped) return
      stopped = true
      for (const timer of timers) clearInterval(timer)
      await Promise.all(nodes.map((n) => n.surface?.close()))
    },
  }
}

// ---- the command line: mq-demo --nodes N ... ----

export const CLUSTER_USAGE = `usage: mq-demo --nodes N [options]

Runs N simulated broker nodes (a leader and followers) in one process, each serving
/metrics, /healthz and /stats on its own port (docs/cluster.md).

options:
  --nodes N                number of nodes, 3 to 9 (1 runs the single-node demo)
  --port PORT              the first node's port; node i gets PORT + i - 1 (default 9464; 0: free ports)
  --host HOST              address to listen on (default 127.0.0.1)
  --duration SECONDS       stop after this long (default: run until Ctrl-C)
  --topics N               number of topics, ${PARTITIONS} partitions each (default 4, at most 50)
  --rate MSGS_PER_SECOND   what the leader takes, over all topics (default 500)
  --scenario NAME          steady (default); partition: the leader is cut off, then heals;
                           failover: the leader's process dies, then restarts as a follower
  --phase SECONDS          length of each of the scenario's 4 phases (default 15)
  -h, --help               show this help
`

export function parseClusterArgs(argv: readonly string[]): { help: boolean; options: Omit<ClusterOptions, 'line'> & { duration: number | undefined } } {
  const { help, values } = scanFlags(argv, ['--nodes', '--port', '--host', '--duration', '--topics', '--rate', '--scenario', '--phase'])
  const number = (flag: string, fallback: number, min: number, max: number, integer: boolean) => {
    const raw = values.get(flag)
    if (raw === undefined) return fallback
    const n = Number(raw)
    if (raw.trim() === '' || !Number.isFinite(n) || n < min || n > max || (integer && !Number.isInteger(n))) {
      throw new UsageError(`${flag} must be ${integer ? 'an integer' : 'a number'} from ${min} to ${max}, got ${JSON.stringify(raw)}`)
    }
    return n
  }
  const scenario = values.get('--scenario') ?? 'steady'
  if (!(CLUSTER_SCENARIOS as readonly string[]).includes(scenario)) {
    throw new UsageError(`--scenario must be one of ${CLUSTER_SCENARIOS.join(', ')} for a cluster, got ${JSON.stringify(scenario)}`)
  }
  const nodes = number('--nodes', 3, 3, 9, true)
  const port = number('--port', 9464, 0, 65535, true)
  if (port !== 0 && port + nodes - 1 > 65535) throw new UsageError(`--port ${port} leaves no room for ${nodes} nodes`)
  return {
    help,
    options: {
      nodes,
      port,
      host: values.get('--host') ?? '127.0.0.1',
      duration: values.has('--duration') ? number('--duration', 0, 0.1, 366 * 86400, false) : undefined,
      topics: number('--topics', 4, 1, 50, true),
      rate: number('--rate', 500, 1, 100_000, false),
      scenario: scenario as ClusterScenario,
      phase: number('--phase', 15, 0.5, 3600, false),
    },
  }
}

/** `mq-demo --nodes N`: runs until --duration or Ctrl-C; 64 for a usage error. */
export async function clusterCli(argv: readonly string[]): Promise<number> {
  let parsed: ReturnType<typeof parseClusterArgs>
  try {
    parsed = parseClusterArgs(argv)
  } catch (error) {
    if (!(error instanceof UsageError)) throw error
    process.stderr.write(`mq-demo: ${error.message}\n\n${CLUSTER_USAGE}`)
    return 64
  }
  if (parsed.help) {
    process.stdout.write(CLUSTER_USAGE)
    return 0
  }
  const { duration, ...options } = parsed.options
  // Listening before the nodes start, so before "press Ctrl-C to stop" is printed: a Ctrl-C that
  // came between that line and a listener would take Node's default action (killed by the signal,
  // nothing closed). One during start-up stops the nodes once they have started.
  let timer: NodeJS.Timeout | undefined
  let stopWith: (reason: string) => void = () => {}
  const stopped = new Promise<string>((resolve) => (stopWith = resolve))
  const undo = onStop((signal) => {
    undo()
    clearTimeout(timer)
    stopWith(signal)
  })
  let cluster: Cluster
  try {
    cluster = await runCluster({ ...options, line: (text) => process.stdout.write(`${text}\n`) })
  } catch (error) {
    undo()
    process.stderr.write(`mq-demo: ${(error as Error).message}\n`)
    return 1
  }
  process.stdout.write(duration === undefined ? 'press Ctrl-C to stop\n' : `stopping after ${duration} s (Ctrl-C stops earlier)\n`)
  if (duration !== undefined) timer = setTimeout(() => (undo(), stopWith('duration')), duration * 1000)
  const reason = await stopped
  clearTimeout(timer) // stopped by a signal during start-up: the duration's timer came after it
  process.stdout.write(`stopping (${reason}): closing ${options.nodes} nodes...\n`)
  const started = Date.now()
  await cluster.stop()
  process.stdout.write(`stopped: ${options.nodes} nodes closed in ${Date.now() - started} ms\n`)
  return 0
}
