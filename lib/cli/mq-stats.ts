#!/usr/bin/env node
// design §10: `mq-stats`, the operator's view of one or more brokers. It reads /healthz and /stats
// over HTTP (never the library's memory), so it works against any broker that serves them.
import * as fs from 'node:fs'
import * as http from 'node:http'
import * as https from 'node:https'
import { toJSON } from '../core/json'
import { isStatsView, STATS_VIEWS, type StatsView } from '../exposition/stats'
import { displayWidth, oneLine, terminalSafe } from './terminal'

export const DEFAULT_URL = 'http://127.0.0.1:9464'
/** Per request, connection to last body byte. */
export const REQUEST_TIMEOUT_MS = 5000
export const EXIT_UNREACHABLE = 3
/** Several brokers read that do not agree on one leader (see disagreement()). */
export const EXIT_LEADERS_DISAGREE = 4
/** BSD sysexits EX_USAGE. */
export const EXIT_USAGE = 64
const EXIT_INTERRUPTED = 130

export const USAGE = `Usage: mq-stats [--url URL ...] [--urls-from FILE] [--token TOKEN] [VIEW] [--watch SECONDS] [--json]

Reads /healthz and /stats from one or more mq-metrics brokers and prints a table.

  VIEW             one of: ${STATS_VIEWS.join(', ')}
                   (default: one summary row per broker)
  --url URL        broker base URL; repeat for several brokers (default ${DEFAULT_URL}); credentials
                   in it (http://user:password@host, for a proxy) are sent, not with a token (both
                   are the Authorization header), and shown as user:*** (*** for a user alone)
  --urls-from FILE more brokers (FILE - reads stdin): one URL (or host:port) per line, # comments, or a Prometheus file_sd JSON
                   file ([{"targets": ["host:port", ...]}]), at most 4 MiB; with several brokers
                   the summary ends with a cluster line: worst tier, the leader, whether epochs agree
                   (one per cluster where file_sd labels cluster or namespace tell clusters apart)
  --token TOKEN    bearer token for brokers with metrics_auth_token
                   (default: the MQ_STATS_TOKEN environment variable, which ps cannot show)
  --watch SECONDS  redraw every SECONDS until Ctrl-C, then exit with the last status
  --json           print JSON with exact integers: an array with one entry per broker
  --help, -h       show this help

Exit status: the worst quorum_state of the brokers read (with --watch, in the last frame) (0 healthy, 1 soft, 2 read_only); 3 when a broker is
unreachable or answers with an error; 4 when several brokers of one cluster do not agree on one leader (two
leaders, a leader at a lower epoch, epochs that disagree: said on stderr), whatever else; 64 for a usage error; 130 when interrupted before the first frame;
74 when its output cannot be written (a full disk); 70 for an internal error (a bug; its message is on stderr).
Colour only when stdout is a terminal and NO_COLOR is not set.
`

export interface CliIO {
  stdout: { write(text: string): unknown; isTTY?: boolean }
  stderr: { write(text: string): unknown }
  /** Aborted on Ctrl-C: ends --watch (and any request in progress). */
  signal?: AbortSignal
  /**
   * Called once the arguments are read, to start listening for Ctrl-C (then `signal`). Until then
   * the process keeps the default SIGINT action, which ends it even in a read that blocks: a
   * --urls-from FIFO nobody writes to is read synchronously, and a listener would never run.
   */
  listen?: () => void
}

interface Options {
  urls: string[]
  /**
   * The cluster of each URL from a file_sd file whose target groups carry a `cluster` or
   * `namespace` label (as the cluster rules tell clusters apart: docs/cluster.md, "Labels"), shown
   * as `{cluster="eu-1"}`; '' for every other URL.
   */
  clusters: Map<string, string>
  token: string | undefined
  view: StatsView | undefined
  watchSeconds: number | undefined
  json: boolean
  help: boolean
}

class UsageError extends Error {}

/**
 * A broker that could not be read: unreachable, timed out, non-2xx, or not our JSON. `short` is
 * what the summary table shows in its row ('unreachable', 'HTTP 401', 'bad answer').
 */
class BrokerError extends Error {
  constructor(message: string, readonly short: string) {
    super(message)
  }
}

class Interrupted extends Error {}

/** Runs the tool; resolves to the exit status. Never throws for a bad argument or a bad broker. */
export async function main(argv: readonly string[], env: NodeJS.ProcessEnv = process.env, io: CliIO = { stdout: process.stdout, stderr: process.stderr }): Promise<number> {
  let options: Options
  try {
    options = parseArgs(argv, env)
  } catch (error) {
    if (!(error instanceof UsageError)) throw error
    io.stderr.write(`mq-stats: ${error.message} (see mq-stats --help)\n`)
    return EXIT_USAGE
  }
  if (options.help) {
    io.stdout.write(USAGE)
    return 0
  }
  io.listen?.()
  const colour = io.stdout.isTTY === true && !env.NO_COLOR // no-color.org: set and non-empty
  let status: number | undefined
  for (;;) {
    let frame: Frame
    try {
      frame = await collect(options, io.signal)
    } catch (error) {
      if (error instanceof Interrupted) return status ?? EXIT_INTERRUPTED
      throw error
    }
    const text = options.json ? toJSON(frame.json, options.watchSeconds === undefined ? 2 : 0) + '\n' : renderFrame(options, frame, colour)
    if (options.watchSeconds !== undefined && !options.json) {
      // On a terminal each frame replaces the last (home, clear); in a pipe frames follow each other.
      const redraw = io.stdout.isTTY ? '\x1b[H\x1b[2J' : status === undefined ? '' : '\n'
      io.stdout.write(`${redraw}${new Date().toISOString()}  every ${options.watchSeconds}s, Ctrl-C to stop\n\n${text}`)
    } else {
      io.stdout.write(text)
    }
    // After the frame: a terminal's redraw would clear lines written before it.
    for (const line of frame.errors) io.stderr.write(`mq-stats: ${terminalSafe(line)}\n`) // a broker's words: no escape sequences
    status = frame.status
    if (options.watchSeconds === undefined) return status
    if (!(await sleep(options.watchSeconds * 1000, io.signal))) return status
  }
}

function parseArgs(argv: readonly string[], env: NodeJS.ProcessEnv): Options {
  const options: Options = { urls: [], clusters: new Map(), token: undefined, view: undefined, watchSeconds: undefined, json: false, help: false }
  let token: string | undefined
  let optionsEnded = false
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]
    if (optionsEnded || !arg.startsWith('-') || arg === '-') {
      if (options.view !== undefined) throw new UsageError(`only one VIEW may be given, got ${JSON.stringify(options.view)} and ${JSON.stringify(arg)}`)
      if (!isStatsView(arg)) throw new UsageError(`unknown view ${JSON.stringify(arg)}; allowed views: ${STATS_VIEWS.join(', ')}`)
      options.view = arg
      continue
    }
    if (arg === '--') {
      optionsEnded = true
      continue
    }
    const eq = arg.indexOf('=')
    const name = eq === -1 ? arg : arg.slice(0, eq)
    const takesValue = name === '--url' || name === '--urls-from' || name === '--token' || name === '--watch'
    if (eq !== -1 && !takesValue) throw new UsageError(`${name} takes no value`)
    let value: string | undefined
    if (takesValue) {
      if (eq !== -1) value = arg.slice(eq + 1)
      else if (i + 1 < argv.length) value = argv[++i]
      else throw new UsageError(`${name} needs a value`)
    }
    switch (name) {
      case '--url':
        options.urls.push(checkUrl(value!))
        break
      case '--urls-from':
        for (const { url, cluster } of urlsFrom(value!)) {
          options.urls.push(url)
          const broker = sameBroker(url)
          if (!options.clusters.has(broker)) options.clusters.set(broker, cluster) // a URL listed twice is one broker, in the first cluster that lists it
        }
        break
      case '--token':
        if (value === '') throw new UsageError('--token must not be empty')
        token = value
        break
      case '--watch': {
        const seconds = /^(\d+(\.\d+)?|\.\d+)$/.test(value!) ? Number(value) : NaN
        if (!(seconds >= 0.1 && seconds <= 86400)) throw new UsageError(`--watch needs a number of seconds from 0.1 to 86400, got ${JSON.stringify(value)}`)
        options.watchSeconds = seconds
        break
      }
      case '--json':
        options.json = true
        break
      case '--help':
      case '-h':
        options.help = true
        break
      default:
        throw new UsageError(`unknown option ${JSON.stringify(name)}`)
    }
  }
  if (options.urls.length === 0) options.urls.push(DEFAULT_URL)
  // A broker named twice (--url and a --urls-from file, or HTTP://Host:80 and http://host, with
  // credentials or without) is one broker: read and counted once, under the name first given.
  const named = new Set<string>()
  options.urls = options.urls.filter((url) => {
    const key = sameBroker(url)
    return !named.has(key) && named.add(key)
  })
  options.token = token ?? (env.MQ_STATS_TOKEN || undefined)
  if (options.token !== undefined) checkToken(options.token, token !== undefined ? '--token' : 'MQ_STATS_TOKEN')
  // Both would be the one Authorization header, and node:http sends only the token then.
  const withCredentials = options.token === undefined ? undefined : options.urls.find((url) => new URL(url).username !== '')
  if (withCredentials !== undefined) {
    throw new UsageError(`${token !== undefined ? '--token' : 'MQ_STATS_TOKEN'} and the credentials in ${JSON.stringify(shownUrl(withCredentials))} cannot both be sent: each is the Authorization header`)
  }
  return options
}

/**
 * What node:http refuses in a header value (a control character but tab, a character above
 * U+00FF): such a token cannot be sent, so it is a usage error, not an unreachable broker.
 */
const NOT_IN_A_HEADER = /[^\t\x20-\x7e\x80-\xff]/u

function checkToken(token: string, source: string): void {
  const bad = NOT_IN_A_HEADER.exec(token)
  if (bad === null) return
  const code = `U+${bad[0].codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}`
  throw new UsageError(`${source} has a character an HTTP header cannot carry (${code}): a broker's metrics_auth_token is visible ASCII`)
}

/**
 * The largest --urls-from file read (bytes): ~100,000 URLs. A device or pipe that never ends
 * (/dev/zero) would otherwise be read until memory runs out.
 */
export const MAX_URLS_FILE_BYTES = 4 * 2 ** 20

/**
 * The labels of a file_sd target group that name its cluster, as the cluster rules aggregate by
 * them (with `job`, which a file seldom sets: the scrape config's name is its default, unknown here).
 */
const CLUSTER_LABELS = ['cluster', 'namespace']

/** What tells two URLs of one broker from two brokers: the URL parser's form (scheme and host in lower case, a default port dropped, an empty path as `/`), without credentials. A host named two ways (localhost, 127.0.0.1) is two brokers. */
function sameBroker(url: string): string {
  const parsed = new URL(url)
  parsed.username = ''
  parsed.password = ''
  return parsed.href
}

/**
 * --urls-from FILE: one URL per line, or a Prometheus file_sd JSON file (its targets, over http,
 * each with its group's cluster: Options.clusters).
 */
function urlsFrom(file: string): { url: string; cluster: string }[] {
  let content: string
  try {
    content = readBounded(file, MAX_URLS_FILE_BYTES).replace(/^\uFEFF/, '') // a byte order mark, as some editors write
  } catch (error) {
    if (error instanceof UsageError) throw error
    throw new UsageError(`cannot read --urls-from ${JSON.stringify(file)}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`)
  }
  if (/^\s*\[\s*[{\]]/.test(content)) { // [{"targets": …}] or [], not a line [::1]:9464
    let groups: unknown
    try {
      groups = JSON.parse(content)
    } catch (error) {
      // Not the parser's message: a newer Node's quotes the file, and a line may hold a password.
      const at = /position (\d+)/.exec((error as Error).message)?.[1]
      throw new UsageError(`--urls-from ${JSON.stringify(file)} looks like file_sd JSON but does not parse${at === undefined ? '' : ` (at character ${at})`}`)
    }
    const shape = `--urls-from ${JSON.stringify(file)}: file_sd JSON must be [{"targets": ["host:port", ...], "labels": {"name": "value", ...}}, ...]`
    if (!Array.isArray(groups)) throw new UsageError(shape)
    const out: { url: string; cluster: string }[] = []
    for (const g of groups) {
      if (!isObject(g) || !Array.isArray(g.targets) || g.targets.some((x) => typeof x !== 'string')) throw new UsageError(shape)
      if (g.labels !== undefined && (!isObject(g.labels) || Object.values(g.labels).some((v) => typeof v !== 'string'))) throw new UsageError(shape)
      const labels = (g.labels ?? {}) as Record<string, string>
      const named = CLUSTER_LABELS.filter((name) => labels[name] !== undefined && labels[name] !== '')
      const cluster = named.length === 0 ? '' : `{${named.map((name) => `${name}=${JSON.stringify(labels[name])}`).join(', ')}}`
      for (const target of g.targets as string[]) out.push({ url: checkUrl(target, `--urls-from ${JSON.stringify(file)}`, true), cluster })
    }
    if (out.length === 0) throw new UsageError(`--urls-from ${JSON.stringify(file)} lists no target`)
    return out
  }
  if (/^\s*\{/.test(content)) throw new UsageError(`--urls-from ${JSON.stringify(file)}: file_sd JSON must be [{"targets": ["host:port", ...], "labels": {"name": "value", ...}}, ...]: an array of target groups, not one object`)
  if (/^\s*-?\s*targets\s*:/m.test(content)) {
    throw new UsageError(`--urls-from ${JSON.stringify(file)} looks like file_sd YAML, which mq-stats does not read: give it the JSON form ([{"targets": ["host:port", ...]}]) or one URL per line`)
  }
  const urls = content.split('\n').map((line) => line.replace(/#.*/, '').trim()).filter((line) => line !== '')
  if (urls.length === 0) throw new UsageError(`--urls-from ${JSON.stringify(file)} lists no URL`)
  return urls.map((line) => ({ url: checkUrl(line, `--urls-from ${JSON.stringify(file)}`, true), cluster: '' }))
}

/** The file as UTF-8, read up to `max` bytes: past them, a UsageError (nothing more is read). */
function readBounded(file: string, max: number): string {
  const stdin = file === '-'
  const fd = stdin ? 0 : fs.openSync(file, 'r')
  try {
    const buffer = Buffer.alloc(max + 1)
    let length = 0
    for (;;) {
      let read: number
      try {
        read = fs.readSync(fd, buffer, length, buffer.length - length, null)
      } catch (error) {
        // stdin left non-blocking by whoever holds its other end: wait for it, as a shell's pipe would
        if ((error as NodeJS.ErrnoException).code !== 'EAGAIN') throw error
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10)
        continue
      }
      if (read === 0) break
      length += read
      if (length > max) throw new UsageError(`--urls-from ${JSON.stringify(file)} is larger than ${max / 2 ** 20} MiB: not a list of brokers`)
    }
    return buffer.toString('utf8', 0, length)
  } finally {
    if (!stdin) fs.closeSync(fd)
  }
}

/** host:port as Prometheus writes a target: a name or IPv4 address, or an IPv6 one in brackets. */
const BARE_TARGET = /^(\[[0-9a-f:.]+\]|[^/?#@\s:[\]]+)(:\d{1,5})?$/i
/** A host a broker can have, as the URL parser leaves it: a DNS name (IDN in punycode) or IPv4, or IPv6 in brackets. */
const HOST = /^(\[[0-9a-f:.]+\]|[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?)$/i

/**
 * `written` as a broker's base URL; `source` names where it came from in the error. With
 * `bareTarget`, a value without a scheme (`host:port`, as Prometheus writes targets) is served over
 * http; an error still quotes the value as written.
 */
function checkUrl(written: string, source = '--url', bareTarget = false): string {
  const hasScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(written)
  // A bare target is a host and a port, nothing more: `htp:/oops` is a mistyped URL, not host htp.
  if (bareTarget && !hasScheme && !BARE_TARGET.test(written)) {
    throw new UsageError(`${source} needs a URL (http://host:port) or host:port, got ${JSON.stringify(shownUrl(written))}`)
  }
  const value = bareTarget && !hasScheme ? `http://${written}` : written
  let url: URL
  try {
    url = new URL(value)
  } catch {
    throw new UsageError(`${source} needs an absolute http(s) URL such as ${DEFAULT_URL}, got ${JSON.stringify(shownUrl(written))}`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new UsageError(`${source} needs an http or https URL, got ${JSON.stringify(shownUrl(written))}`)
  }
  if (!HOST.test(url.hostname)) {
    throw new UsageError(`${source} needs a host name or an IP address, got ${JSON.stringify(shownUrl(written))}`)
  }
  // Port 0 is no port a broker listens on: the request would go to the scheme's default port
  // (80 or 443) and its answer be shown as this URL's.
  if (url.port === '0' || /^0+$/.test(url.port)) {
    throw new UsageError(`${source} needs a port from 1 to 65535, got ${JSON.stringify(shownUrl(written))}`)
  }
  // The paths read are appended to the URL: a query or fragment would take them in.
  if (/[?#]/.test(value)) {
    throw new UsageError(`${source} is a broker's base URL (a path prefix at most), without a query (?) or fragment (#), got ${JSON.stringify(shownUrl(written))}`)
  }
  try {
    decodeURIComponent(url.username), decodeURIComponent(url.password) // as the request decodes them
  } catch {
    throw new UsageError(`${source} has credentials with a malformed %-escape (a % not followed by the UTF-8 of a character in hex), got ${JSON.stringify(shownUrl(written))}`)
  }
  return value.replace(/\/+$/, '')
}

/**
 * A broker's URL as shown (table, --json, stderr): credentials in it (`http://user:secret@host`,
 * for a proxy in front of the broker) are written `user:***`, or `***` for a user name alone
 * (which may be a token), as a terminal, a log or a CI transcript may be read by others. The
 * request itself uses the URL as given. Credentials end at the authority's last `@`, as the URL
 * parser reads them; text that is no URL (a usage error) is masked up to its last `@`.
 */
function shownUrl(text: string): string {
  const scheme = /^[a-z][a-z0-9+.-]*:\/\//i.exec(text)?.[0] ?? ''
  const rest = text.slice(scheme.length)
  let url: URL | undefined
  try {
    url = new URL(scheme === '' ? `http://${rest}` : text)
  } catch {
    // not a URL: mask below
  }
  const end = rest.search(/[/?#]/)
  const authority = url === undefined || end === -1 ? rest : rest.slice(0, end)
  const at = authority.lastIndexOf('@')
  if (at === -1) return text
  const colon = authority.indexOf(':')
  const shown = colon === -1 || colon > at ? '***' : `${authority.slice(0, colon)}:***`
  return scheme + shown + rest.slice(at)
}

// ---------------------------------------------------------------------------------------------
// Reading the brokers

type Json = unknown
type JsonObject = Record<string, Json>

interface BrokerRead {
  url: string
  error?: string
  /** The error in a word or two, for the table. */
  errorShort?: string
  quorumState?: 0 | 1 | 2
  status?: string
  healthz?: JsonObject
  views: Record<string, JsonObject>
}

interface Frame {
  brokers: BrokerRead[]
  /** The brokers by cluster (clustersOf): judged in collect(), a cluster line each in the summary. */
  clusters: [string, BrokerRead[]][]
  json: unknown
  errors: string[]
  status: number
}

async function collect(options: Options, signal: AbortSignal | undefined): Promise<Frame> {
  const views: StatsView[] = options.view === undefined ? ['quorum', 'topics'] : [options.view]
  const brokers = await readAll(options.urls, views, options.token, signal)
  const errors: string[] = []
  let status = 0
  for (const b of brokers) {
    if (b.error !== undefined) {
      errors.push(`${b.url}: ${b.error}`)
      status = EXIT_UNREACHABLE
    } else if (status !== EXIT_UNREACHABLE) {
      status = Math.max(status, b.quorumState!)
    }
  }
  const clusters = clustersOf(options, brokers)
  for (const [name, nodes] of clusters) {
    const reasons = nodes.length > 1 ? disagreement(leadership(nodes)) : []
    if (reasons.length === 0) continue
    status = EXIT_LEADERS_DISAGREE
    errors.push(`${name === '' ? 'the brokers' : `cluster ${name}`} do not agree on one leader: ${reasons.join('; ')}`)
  }
  const json = brokers.map((b) => {
    if (b.error !== undefined) return { url: b.url, error: b.error }
    return options.view === undefined ? summaryRow(b) : { url: b.url, quorum_state: b.quorumState, status: b.status, leader: leaderOf(b), leader_epoch: epochOf(b), view: b.views[options.view] }
  })
  return { brokers, clusters, json, errors, status }
}

/**
 * Brokers read at once, each over at most 3 connections: a long --urls-from list (endpoints.md
 * allows ~100,000) stays far within the process's file descriptors, where reading every broker at
 * once ran out of them (EMFILE) at a few hundred and called live brokers unreachable.
 */
export const BROKERS_AT_ONCE = 64

/** Every broker read, in the order given, at most BROKERS_AT_ONCE at a time (each request's timeout starts when it is sent). */
async function readAll(urls: readonly string[], views: StatsView[], token: string | undefined, signal: AbortSignal | undefined): Promise<BrokerRead[]> {
  const reads: BrokerRead[] = new Array(urls.length)
  let next = 0
  const lane = async (): Promise<void> => {
    while (next < urls.length) {
      const at = next++
      reads[at] = await readBroker(urls[at], views, token, signal)
    }
  }
  await Promise.all(Array.from({ length: Math.min(BROKERS_AT_ONCE, urls.length) }, lane))
  return reads
}

async function readBroker(url: string, views: StatsView[], token: string | undefined, signal: AbortSignal | undefined): Promise<BrokerRead> {
  const read: BrokerRead = { url: shownUrl(url), views: {} }
  try {
    const [healthz, ...bodies] = await Promise.all([
      // design §7: /healthz answers 503 in read_only; that is a reading, not an error.
      getJson(url, '/healthz', token, signal, [200, 503]),
      ...views.map((view) => getJson(url, `/stats?filter=${view}`, token, signal, [200])),
    ])
    const state = healthz.quorum_state
    if (state !== 0 && state !== 1 && state !== 2) throw new BrokerError(`/healthz has no quorum_state 0, 1 or 2`, 'bad answer')
    checkShape('/healthz', healthz, state)
    if (bodies.length !== 0 && views[0] === 'quorum') checkShape('/stats?filter=quorum', bodies[0], bodies[0].quorum_state)
    read.healthz = healthz
    read.quorumState = state
    read.status = typeof healthz.status === 'string' ? healthz.status : String(state)
    views.forEach((view, i) => (read.views[view] = bodies[i]))
  } catch (error) {
    if (error instanceof Interrupted) throw error
    read.error = oneLine(error instanceof BrokerError ? error.message : `unexpected error: ${(error as Error).message}`)
    read.errorShort = error instanceof BrokerError ? error.short : 'error'
  }
  return read
}

/**
 * The fields of /healthz (and the quorum view) that mq-stats shows or judges by, each of its type
 * when present (a broker too old to have one leaves it out): a body that has one of another type
 * is not an mq-metrics answer (a proxy's, a hostile endpoint's), and its values must not reach the
 * table, --json, or the judgement of leaders.
 */
function checkShape(path: string, body: JsonObject, state: unknown): void {
  const count = (v: unknown) => (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0) || (typeof v === 'bigint' && v >= 0n)
  const wrong = (field: string, what: string) => {
    const value = toJSON(body[field])
    return new BrokerError(`${path} has ${field} ${value.length > 40 ? `${value.slice(0, 40)}…` : value}, not ${what}`, 'bad answer')
  }
  if (state !== 0 && state !== 1 && state !== 2) throw wrong('quorum_state', '0, 1 or 2')
  if (body.status !== undefined && body.status !== TIER_WORDS[state]) throw wrong('status', `"${TIER_WORDS[state]}" (its quorum_state is ${state})`)
  if (body.leader !== undefined && typeof body.leader !== 'boolean') throw wrong('leader', 'true or false')
  for (const field of ['leader_epoch', 'connections', 'faults']) {
    if (body[field] !== undefined && !count(body[field])) throw wrong(field, 'a count (an integer from 0)')
  }
  const uptime = body.uptime_seconds
  if (uptime !== undefined && !(typeof uptime === 'number' && Number.isFinite(uptime) && uptime >= 0)) throw wrong('uptime_seconds', 'a number of seconds from 0')
}

async function getJson(base: string, path: string, token: string | undefined, interrupt: AbortSignal | undefined, okStatuses: number[]): Promise<JsonObject> {
  const timeout = AbortSignal.timeout(REQUEST_TIMEOUT_MS)
  const signal = interrupt ? AbortSignal.any([timeout, interrupt]) : timeout
  const headers: Record<string, string> = { accept: 'application/json' }
  if (token !== undefined) headers.authorization = `Bearer ${token}`
  let statusCode: number
  let text: string
  try {
    ;({ statusCode, text } = await get(base + path, path, headers, signal))
  } catch (error) {
    if (interrupt?.aborted) throw new Interrupted()
    if (error instanceof BrokerError) throw error
    // Reached, but what came back is not HTTP (llhttp's parse errors are HPE_…): a bad answer.
    const code = (error as NodeJS.ErrnoException).code
    if (typeof code === 'string' && code.startsWith('HPE_')) throw new BrokerError(`GET ${path} did not answer with HTTP (${code})`, 'bad answer')
    if (timeout.aborted) throw new BrokerError(`unreachable: GET ${path} timed out after ${REQUEST_TIMEOUT_MS / 1000} s`, 'unreachable')
    // Reached, and it began to answer: an answer cut short is a bad one.
    if (error instanceof CutShort) throw new BrokerError(`GET ${path} was cut short: the connection closed before the whole answer (${error.message})`, 'bad answer')
    throw new BrokerError(`unreachable: ${(error as Error).message}`, 'unreachable')
  }
  let body: Json
  try {
    body = parseExactJSON(text)
  } catch {
    body = undefined
  }
  // /healthz answers 503 in read_only with its health body; a 503 with an error body (the surface
  // closed, too many connections) is an error answer, however its status reads.
  const errorBody = statusCode >= 400 && isObject(body) && isObject(body.error)
  if (!okStatuses.includes(statusCode) || errorBody) {
    const detail = isObject(body) && isObject(body.error) ? `${body.error.code}: ${body.error.message}` : text.slice(0, 200)
    // 401 is the one an operator fixes at the command line: say how.
    const hint = statusCode !== 401 ? '' : token === undefined
      ? '; this broker needs its metrics_auth_token: pass --token TOKEN or set MQ_STATS_TOKEN'
      : '; the token given (--token or MQ_STATS_TOKEN) was refused'
    throw new BrokerError(`GET ${path} answered HTTP ${statusCode}${detail ? ` (${detail})` : ''}${hint}`, `HTTP ${statusCode}`)
  }
  if (!isObject(body)) throw new BrokerError(`GET ${path} did not answer with a JSON object`, 'bad answer')
  return body
}

/** The longest answer read from a broker (bytes): /stats of a large broker is a few MB. */
const MAX_ANSWER_BYTES = 64 * 2 ** 20

/** The answer's body ended before its end: the broker was reached, so not unreachable. */
class CutShort extends Error {}

/**
 * One GET with node:http(s), not fetch(): fetch refuses the ports the Fetch standard calls bad
 * (6000, 6665–6669, 10080, …) whatever listens there, and a broker may serve on one. Redirects
 * are not followed (a 3xx is an error answer, as an error status is).
 */
function get(url: string, path: string, headers: Record<string, string>, signal: AbortSignal): Promise<{ statusCode: number; text: string }> {
  return new Promise((resolve, reject) => {
    const target = new URL(url)
    const client = target.protocol === 'https:' ? https : http
    const request = client.request(target, { headers, signal, agent: false }, (response) => {
      const chunks: Buffer[] = []
      let bytes = 0
      response.on('data', (chunk: Buffer) => {
        chunks.push(chunk)
        bytes += chunk.length
        if (bytes <= MAX_ANSWER_BYTES) return
        // Not a /stats answer (the largest are a few MB): read no further, hold no more.
        request.destroy()
        reject(new BrokerError(`GET ${path} answered more than ${MAX_ANSWER_BYTES / 2 ** 20} MiB: not an mq-metrics answer`, 'bad answer'))
      })
      response.on('end', () => resolve({ statusCode: response.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }))
      response.on('error', (error) => reject(signal.aborted ? error : new CutShort(error.message)))
    })
    request.on('error', reject)
    request.end()
  })
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false)
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort)
      resolve(true)
    }, ms)
    const onAbort = () => {
      clearTimeout(timer)
      resolve(false)
    }
    signal?.addEventListener('abort', onAbort, { once: true })
  })
}

// ---------------------------------------------------------------------------------------------
// Exact JSON: integers beyond 2^53 − 1 become bigints (JSON.parse would round them), so --json
// prints what the broker sent, digit for digit.

export function parseExactJSON(text: string): unknown {
  let i = 0
  const STRING = /"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/y
  const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y
  const fail = (): never => {
    throw new SyntaxError(`invalid JSON at position ${i}`)
  }
  const space = () => {
    while (i < text.length && (text[i] === ' ' || text[i] === '\n' || text[i] === '\r' || text[i] === '\t')) i++
  }
  const expect = (c: string) => {
    space()
    if (text[i] !== c) fail()
    i++
  }
  const string = (): string => {
    STRING.lastIndex = i
    const m = STRING.exec(text) ?? fail()
    i = STRING.lastIndex
    return JSON.parse(m[0]) as string
  }
  const value = (depth: number): unknown => {
    if (depth > 512) fail()
    space()
    const c = text[i]
    if (c === '{') {
      i++
      const object: JsonObject = {}
      space()
      if (text[i] === '}') return i++, object
      for (;;) {
        space()
        if (text[i] !== '"') fail()
        const key = string()
        expect(':')
        // defineProperty: a key "__proto__" is data, not a prototype change.
        Object.defineProperty(object, key, { value: value(depth + 1), enumerable: true, writable: true, configurable: true })
        space()
        if (text[i] === ',') {
          i++
          continue
        }
        expect('}')
        return object
      }
    }
    if (c === '[') {
      i++
      const array: unknown[] = []
      space()
      if (text[i] === ']') return i++, array
      for (;;) {
        array.push(value(depth + 1))
        space()
        if (text[i] === ',') {
          i++
          continue
        }
        expect(']')
        return array
      }
    }
    if (c === '"') return string()
    for (const [word, literal] of [['true', true], ['false', false], ['null', null]] as const) {
      if (text.startsWith(word, i)) return (i += word.length), literal
    }
    NUMBER.lastIndex = i
    const m = NUMBER.exec(text) ?? fail()
    i = NUMBER.lastIndex
    const n = Number(m[0])
    return m[1] === undefined && m[2] === undefined && !Number.isSafeInteger(n) ? BigInt(m[0]) : n
  }
  const result = value(0)
  space()
  if (i !== text.length) fail()
  return result
}

function isObject(value: unknown): value is JsonObject {
  return value !== null && typeof value === 'object' && !Array.isArray(value)
}

// ---------------------------------------------------------------------------------------------
// Rendering

const TOTALS = ['produced', 'delivered', 'dropped', 'dlq'] as const

/** What a broker's /healthz says of its leadership (null from a broker too old to say). */
function leaderOf(b: BrokerRead): boolean | null {
  return typeof b.healthz?.leader === 'boolean' ? b.healthz.leader : null
}

/** The broker's leader_epoch from /healthz (or its quorum view); null when neither has one. */
function epochOf(b: BrokerRead): Json {
  return b.healthz?.leader_epoch ?? b.views.quorum?.leader_epoch ?? null
}

function summaryRow(b: BrokerRead): JsonObject {
  const h = b.healthz!
  const quorum = b.views.quorum ?? {}
  const totals: Record<string, bigint> = { produced: 0n, delivered: 0n, dropped: 0n, dlq: 0n }
  const topics = b.views.topics?.topics
  for (const t of Array.isArray(topics) ? topics : []) {
    for (const key of TOTALS) {
      const v = isObject(t) ? t[key] : undefined
      if (typeof v === 'bigint' || (typeof v === 'number' && Number.isInteger(v))) totals[key] += BigInt(v)
    }
  }
  const exact = (v: bigint) => (v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v)
  return {
    url: b.url,
    quorum_state: b.quorumState,
    status: b.status,
    leader: leaderOf(b),
    leader_epoch: epochOf(b),
    connections: quorum.connections ?? null,
    uptime_seconds: h.uptime_seconds ?? quorum.uptime_seconds ?? null,
    produced: exact(totals.produced),
    delivered: exact(totals.delivered),
    dropped: exact(totals.dropped),
    dlq: exact(totals.dlq),
    faults: h.faults ?? null,
  }
}

const COLOURS = ['\x1b[32m', '\x1b[33m', '\x1b[31m'] // green healthy, yellow soft, red read_only
const TIER_WORDS = ['healthy', 'soft', 'read_only']
const RESET = '\x1b[0m'

interface Cell {
  text: string
  numeric: boolean
  /** A placeholder ('-'): it does not decide whether its column is numeric (right-aligned). */
  empty?: boolean
  colour?: string
}

const EMPTY: Cell = { text: '-', numeric: false, empty: true }

function renderFrame(options: Options, frame: Frame, colour: boolean): string {
  if (options.view === undefined) {
    const header = ['url', 'quorum_state', 'leader_epoch', 'connections', 'uptime', ...TOTALS, 'faults']
    const rows = frame.brokers.map((b): Cell[] => {
      if (b.error !== undefined) {
        return [text(b.url), { text: b.errorShort ?? 'error', numeric: false, colour: COLOURS[2] }, ...header.slice(2).map(() => EMPTY)]
      }
      const row = summaryRow(b)
      return [
        text(b.url),
        { text: `${b.quorumState} ${terminalSafe(b.status!)}`, numeric: false, colour: COLOURS[b.quorumState!] },
        cell(row.leader_epoch),
        cell(row.connections),
        typeof row.uptime_seconds === 'number' ? { text: formatUptime(row.uptime_seconds), numeric: true } : cell(row.uptime_seconds),
        ...TOTALS.map((key) => cell(row[key])),
        cell(row.faults),
      ]
    })
    if (frame.brokers.length === 1) return table(header, rows, colour)
    return `${table(header, rows, colour)}\n${frame.clusters.map(([name, nodes]) => clusterLine(name, nodes, colour)).join('')}`
  }
  const many = frame.brokers.length > 1
  const parts = frame.brokers.map((b) => {
    if (b.error !== undefined) return `== ${terminalSafe(b.url)} ==\nerror: ${terminalSafe(b.error)}\n`
    const heading = many ? `== ${terminalSafe(b.url)} (quorum_state ${b.quorumState} ${terminalSafe(b.status!)}) ==\n` : ''
    return heading + renderView(b.views[options.view!], colour)
  })
  return parts.join('\n')
}

/**
 * The brokers by cluster, in the order each cluster is first named: one cluster of them all unless
 * a file_sd file named several (Options.clusters).
 */
function clustersOf(options: Options, brokers: BrokerRead[]): [string, BrokerRead[]][] {
  const out = new Map<string, BrokerRead[]>()
  for (const [i, b] of brokers.entries()) {
    const name = options.clusters.get(sameBroker(options.urls[i])) ?? '' // brokers are read in the order of options.urls (b.url is masked)
    ;(out.get(name) ?? out.set(name, []).get(name)!).push(b)
  }
  return [...out]
}

/** Who leads among the brokers read: what the cluster line shows and the exit status 4 judges. */
interface Leadership {
  epoch(b: BrokerRead): number
  /** The highest leader_epoch read (-1: none read). */
  top: number
  /** The nodes that say they lead at the top epoch, and those that lead at a lower one. */
  leaders: BrokerRead[]
  stale: BrokerRead[]
  /** The nodes told an epoch (not 0), and their epochs, highest first. */
  told: BrokerRead[]
  epochs: number[]
}

function leadership(brokers: readonly BrokerRead[]): Leadership {
  const read = brokers.filter((b) => b.error === undefined)
  const epoch = (b: BrokerRead) => (typeof b.healthz?.leader_epoch === 'number' ? b.healthz.leader_epoch : -1)
  const top = Math.max(-1, ...read.map(epoch))
  const leading = read.filter((b) => b.healthz?.leader === true)
  // Epoch 0: a node that has just started and not been told the epoch yet. It disagrees with no
  // one, as in the cluster rules (mq-cluster.rules.yml job:mq_leader_epoch:min).
  const told = read.filter((b) => epoch(b) !== 0)
  return {
    epoch,
    top,
    leaders: leading.filter((b) => epoch(b) === top),
    stale: leading.filter((b) => epoch(b) !== top),
    told,
    epochs: [...new Set(told.map(epoch))].sort((a, b) => b - a),
  }
}

/**
 * Why several brokers do not agree on one leader (docs/cluster.md), as the cluster line says it:
 * two leaders at one epoch, a leader at a lower epoch, nodes told different epochs. Empty when
 * they agree. No leader at all is no disagreement: a broker that never calls setLeader() says it
 * follows, and a leader not read may be the one (its absence is exit status 3).
 */
function disagreement(l: Leadership): string[] {
  const out: string[] = []
  if (l.leaders.length > 1) out.push(leadersText(l))
  if (l.stale.length > 0) out.push(staleText(l))
  if (l.epochs.length > 1) out.push(epochsText(l))
  return out
}

/** The cluster line's words for who leads, a stale leader, and the epochs told. */
function leadersText(l: Leadership): string {
  const u = (b: BrokerRead) => terminalSafe(b.url)
  return l.leaders.length === 0 ? 'leader: none' : l.leaders.length === 1 ? `leader ${u(l.leaders[0])} (epoch ${l.top})` : `${l.leaders.length} leaders at epoch ${l.top}: ${l.leaders.map(u).join(', ')}`
}

function staleText(l: Leadership): string {
  return `stale leader ${l.stale.map((b) => `${terminalSafe(b.url)} (epoch ${l.epoch(b)})`).join(', ')}`
}

function epochsText(l: Leadership): string {
  return l.epochs.length === 1 ? `epochs agree (${l.epochs[0]})` : `epochs disagree: ${l.epochs.map((e) => `${e} on ${l.told.filter((b) => l.epoch(b) === e).length}`).join(', ')}`
}

/**
 * Several brokers read as one cluster (docs/cluster.md): the worst tier and where, the leader (a
 * node whose /healthz says it leads, at the highest epoch; one that leads at a lower epoch is
 * stale: cut off, or not told yet), and whether the nodes agree on the epoch.
 */
function clusterLine(name: string, brokers: BrokerRead[], colour: boolean): string {
  const read = brokers.filter((b) => b.error === undefined)
  const u = (b: BrokerRead) => terminalSafe(b.url)
  const parts: string[] = []
  // No broker read: no tier to show (the exit status, 3, says why), not one nobody reported.
  const worst = read.length === 0 ? 2 : Math.max(...read.map((b) => b.quorumState!))
  const worstAt = read.filter((b) => b.quorumState === worst).map(u)
  const tier = read.length === 0 ? 'worst unknown (no broker read)' : `worst ${worst} ${TIER_WORDS[worst]}${read.length > 1 && worst > 0 ? ` (${worstAt.join(', ')})` : ''}`
  parts.push(colour ? `${COLOURS[worst]}${tier}${RESET}` : tier)
  const l = leadership(brokers)
  const told = l.told
  parts.push(leadersText(l))
  if (l.stale.length > 0) parts.push(staleText(l))
  if (read.length === 0) parts.push('epochs unknown')
  else if (l.epochs.length === 0) parts.push('epochs not told yet (0)')
  else parts.push(epochsText(l))
  if (told.length < read.length && told.length > 0) parts.push(`${read.length - told.length} not told the epoch yet (0)`)
  if (read.length < brokers.length) parts.push(`${brokers.length - read.length} of ${brokers.length} unreachable`)
  return `cluster${name === '' ? '' : ` ${terminalSafe(name)}`}  ${parts.join('  ')}\n`
}

/** View fields that list names (the quorum view's replicas out of sync): one cell, `(none)` when empty, a name with a space quoted. */
const NAME_LISTS: ReadonlySet<string> = new Set(['lagging'])

/** A /stats body: scalars (and lists of names) as key/value rows, each array of objects and each object as a table. */
function renderView(body: JsonObject, colour: boolean): string {
  const scalars: Cell[][] = []
  const sections: { title: string; text: string }[] = []
  for (const [key, value] of Object.entries(body)) {
    if (key === 'filter') continue
    if (NAME_LISTS.has(key) && Array.isArray(value)) {
      // A name that holds a space is quoted: `"node 2, rack 3"` is one name, `a, b` two.
      scalars.push([text(key), text(value.length === 0 ? '(none)' : value.map((name) => quoted(inline(name))).join(', '))])
    } else if (Array.isArray(value) && value.every(isObject)) {
      const { header, rows } = flatten(value as JsonObject[])
      sections.push({ title: key, text: rows.length === 0 ? '(none)\n' : table(header, rows, colour) })
    } else if (isObject(value)) {
      const rows = Object.entries(value).map(([k, v]) => [text(k), cell(v)])
      sections.push({ title: key, text: rows.length === 0 ? '(none)\n' : table(['key', 'value'], rows, colour) })
    } else {
      scalars.push([text(key), cell(value)])
    }
  }
  const out: string[] = []
  if (scalars.length > 0) out.push(table(['key', 'value'], scalars, colour))
  const titled = sections.length > 1 || scalars.length > 0
  for (const s of sections) out.push(titled ? `${terminalSafe(s.title)}:\n${s.text}` : s.text)
  return out.join('\n')
}

/**
 * One row per item; an item field that is an array of objects (a topic's groups, a collision's
 * names) expands to one row per element, its keys beside the parent's (prefixed when they clash).
 */
function flatten(items: JsonObject[]): { header: string[]; rows: Cell[][] } {
  const records: Map<string, Json>[] = []
  for (const item of items) {
    const own = new Map<string, Json>()
    let nested: [string, JsonObject[]] | undefined
    for (const [k, v] of Object.entries(item)) {
      if (nested === undefined && Array.isArray(v) && v.every(isObject)) nested = [k, v as JsonObject[]]
      else own.set(k, v)
    }
    if (nested === undefined || nested[1].length === 0) {
      records.push(own) // a topic without groups: one row, the group columns show '-'
      continue
    }
    const prefix = nested[0].replace(/s$/, '')
    for (const child of nested[1]) {
      const record = new Map(own)
      for (const [k, v] of Object.entries(child)) record.set(own.has(k) ? `${prefix}_${k}` : k, v)
      records.push(record)
    }
  }
  const header: string[] = []
  for (const r of records) for (const k of r.keys()) if (!header.includes(k)) header.push(k)
  return { header, rows: records.map((r) => header.map((k) => (r.has(k) ? cell(r.get(k)) : EMPTY))) }
}

function text(value: string): Cell {
  return { text: terminalSafe(value), numeric: false }
}

function cell(value: Json): Cell {
  if (value === null || value === undefined) return EMPTY
  if (typeof value === 'number' || typeof value === 'bigint') return { text: String(value), numeric: true }
  return { text: terminalSafe(inline(value)), numeric: false }
}

function inline(value: Json): string {
  if (value === null || value === undefined) return '-'
  if (Array.isArray(value)) return value.map(inline).join(', ')
  if (isObject(value)) return Object.keys(value).length === 0 ? '-' : Object.entries(value).map(([k, v]) => `${k}=${quoted(inline(v))}`).join(' ')
  return String(value)
}

/** A value inside `k=v k=v`, quoted when it would read as more than one (a raw name `a b`, `x=y`, or empty). */
function quoted(text: string): string {
  return text === '' || /[\s="]/.test(text) ? JSON.stringify(text) : text
}

function table(raw: string[], rows: Cell[][], colour: boolean): string {
  const header = raw.map(terminalSafe) // keys come from the broker's JSON too
  const width = displayWidth
  const widths = header.map((h, c) => Math.max(width(h), ...rows.map((r) => width(r[c].text))))
  const numeric = header.map((_, c) => rows.some((r) => !r[c].empty) && rows.every((r) => r[c].numeric || r[c].empty === true))
  const line = (cells: Cell[]) =>
    cells
      .map((cell, c) => {
        const pad = ' '.repeat(widths[c] - width(cell.text))
        const padded = numeric[c] ? pad + cell.text : cell.text + (c === cells.length - 1 ? '' : pad)
        return colour && cell.colour ? cell.colour + padded + RESET : padded
      })
      .join('  ')
  return [line(header.map((h, c) => ({ text: h, numeric: numeric[c] }))), ...rows.map(line)].join('\n') + '\n'
}

/** 42s, 5m07s, 2h05m, 3d04h: the two leading units are enough for an operator. */
export function formatUptime(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds))
  const two = (n: number) => String(n).padStart(2, '0')
  if (s < 60) return `${s}s`
  if (s < 3600) return `${Math.floor(s / 60)}m${two(s % 60)}s`
  if (s < 86400) return `${Math.floor(s / 3600)}h${two(Math.floor(s / 60) % 60)}m`
  return `${Math.floor(s / 86400)}d${two(Math.floor(s / 3600) % 24)}h`
}

if (require.main === module) {
  const interrupt = new AbortController()
  const listen = () => process.once('SIGINT', () => interrupt.abort())
  // The reader went away (`mq-stats --watch 1 | head -2`): nothing more can be shown; a quiet
  // exit 0, as for any tool whose output is cut short on purpose, not a stack trace.
  process.stdout.on('error', (error: NodeJS.ErrnoException) => {
    if (error.code === 'EPIPE') process.exit(0)
    // Any other write error (a full disk: ENOSPC) is no quorum state: 74, as sysexits' EX_IOERR.
    process.stderr.write(`mq-stats: cannot write its output: ${oneLine(error.message)}\n`)
    process.exit(74)
  })
  main(process.argv.slice(2), process.env, { stdout: process.stdout, stderr: process.stderr, signal: interrupt.signal, listen }).then(
    (code) => {
      process.exitCode = code
    },
    (error: unknown) => {
      process.stderr.write(`mq-stats: internal error: ${oneLine(String((error as Error)?.message ?? error))}\n`)
      process.exitCode = 70
    },
  )
}
