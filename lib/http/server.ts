// design §7: GET /metrics, /healthz and /stats over node:http — mounted in the broker's own admin
// server (createHandler) or standalone (listen). No framework; nothing here knows what the bodies
// contain: the surface supplies them through HttpHost.
import { IncomingMessage, Server, ServerResponse, createServer } from 'node:http'
import type { Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import { createHash, timingSafeEqual } from 'node:crypto'
import { createGzip, gzip } from 'node:zlib'
import { GZIP_LEVEL, GzipBody } from '../exposition/gzip'
import { METRICS_CONTENT_TYPE } from '../exposition/allowlist'
import { IMMEDIATE_SLICES, JsonChunks, toJSON, toJSONSliced } from '../core/json'
import { SLICE_HOLD_MS } from '../core/observer'
import { describe, isPlainObject, ownOption } from '../core/labels'
import { DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_SCRAPE_BYTES } from './options'
import { ScrapeAbandoned } from './pacing'
import { UsageError } from '../core/errors'

export interface HttpHost {
  /** metrics_enabled at startup: false ⇒ nothing is served and no port is opened. */
  readonly enabled: boolean
  /** metrics_auth_token: when set, every endpoint requires `Authorization: Bearer <token>`. */
  readonly authToken: string | undefined
  /**
   * The /metrics exposition: at once, or a promise of it (a large scrape renders in slices, one
   * scrape at a time). `abandoned()` tells whether the client has gone away: a scrape still
   * waiting for its turn then rejects with ScrapeAbandoned instead of starting.
   */
  metricsBody(abandoned?: () => boolean): Buffer | Promise<Buffer>
  /**
   * For a client that accepts gzip: the exposition as one gzip member (its gunzipped bytes are
   * what metricsBody() gives), or the plain body when it is cheaper to compress whole — compressed
   * here as metricsBody() is, and then handed to metricsSent(). Without it, metricsBody() serves.
   */
  metricsGzip?(abandoned?: () => boolean): GzipBody | Promise<GzipBody>
  /** A metricsBody() result that nothing reads any more (sent, or compressed): its memory may be reused. */
  metricsSent?(body: Buffer): void
  /** /healthz: status code and a JSON-able body (bigints allowed), once the conservation check has run. */
  healthz(): { statusCode: number; body: unknown } | Promise<{ statusCode: number; body: unknown }>
  /**
   * /stats, including its own 400s (missing or unknown filter). A Buffer body is the JSON, written
   * already. `abandoned`: the client has gone; a view still waiting for its turn is then not built
   * (rejects with ScrapeAbandoned).
   */
  stats(query: URLSearchParams, abandoned?: () => boolean): { statusCode: number; body: unknown } | Promise<{ statusCode: number; body: unknown }>
  /** Told about a host method that threw (answered 500); optional. */
  reportError?(error: unknown): void
  /** Bounds on what clients can make the broker hold (design §7); defaults when absent. */
  readonly limits?: { maxConnections: number; maxScrapeBytes: number }
}

export interface ListenOptions {
  /** TCP port; 0 picks a free one. Default 9464 (the mq-stats default URL). */
  port?: number
  /** Interface to bind. Default 127.0.0.1: metrics are not published beyond the host unless asked. */
  host?: string
}

export interface HttpListening {
  readonly port: number
  readonly host: string
  readonly url: string
  /** Stops listening and closes idle and active connections. Idempotent. */
  close(): Promise<void>
}

export const DEFAULT_PORT = 9464
export const DEFAULT_HOST = '127.0.0.1'

const JSON_CONTENT_TYPE = 'application/json; charset=utf-8'
const ALLOW = 'GET, HEAD'
/** Longer request targets are answered 414 (the header block as a whole is capped at 16 KiB). */
export const MAX_URL_LENGTH = 8 * 1024
const MAX_HEADER_SIZE = 16 * 1024
// design §7: Node's defaults let a slowloris client hold a socket for about 90 s.
const HEADERS_TIMEOUT_MS = 10_000
const REQUEST_TIMEOUT_MS = 30_000
/** How long a connection answered with a raw error (a 400, 408, 414, 431…) may stay open for its client to read it. */
const RAW_ERROR_LINGER_MS = 1000
const KEEP_ALIVE_TIMEOUT_MS = 5_000
/** A client that stops reading a response is dropped after this long without progress. */
const SOCKET_IDLE_TIMEOUT_MS = 30_000
/** How often Node checks the header and request timeouts (its default, 30 s, would stretch 10 s to 40 s). */
const TIMEOUT_CHECK_INTERVAL_MS = 1_000
/** Smaller bodies go out as they are: gzip would save a few bytes and cost a thread-pool trip. */
const GZIP_MIN_BYTES = 1024

type Route = '/metrics' | '/healthz' | '/stats'
const ROUTES: ReadonlySet<string> = new Set<Route>(['/metrics', '/healthz', '/stats'])
/** What a scrape refused for lack of room tells the client to wait before trying again (s). */
const RETRY_AFTER_SECONDS = 1
/**
 * A response whose client has taken none of its pending bytes for this long has stalled, and may
 * be cut. What the server sees of a reader is the kernel taking bytes from the socket, and the
 * kernel lets a reader's reads through in steps (the receiver's window updates), not byte by byte:
 * a slow but steady reader can show nothing for a few hundred milliseconds. 2 s leaves it room; a
 * stopped client still frees its body at the next scrape that finds no room 2 s on.
 */
const STALLED_MS = 2000
const DEFAULT_LIMITS = { maxConnections: DEFAULT_MAX_CONNECTIONS, maxScrapeBytes: DEFAULT_MAX_SCRAPE_BYTES }

/**
 * Bytes of a response's socket that its stream handle has not handed to the kernel yet. The
 * socket's writableLength counts a write until all of it is written, so a client that reads a
 * 14 MB body slowly shows no progress there until the end; the handle's writeQueueSize falls as
 * the kernel takes each part. Infinity where the socket has no such handle (then writableLength
 * alone tells progress).
 */
function queuedBytes(res: ServerResponse): number {
  const size = (res.socket as { _handle?: { writeQueueSize?: unknown } } | null | undefined)?._handle?.writeQueueSize
  return typeof size === 'number' ? size : Infinity
}

/**
 * Bytes of /metrics bodies that responses still being written hold, together. A client that stops
 * reading keeps its whole body referenced (Node writes it as the socket drains), so without a bound
 * a few hundred such clients pin gigabytes. Past the bound, responses whose client has taken nothing
 * for STALLED_MS are cut, oldest first; a scrape that still finds no room gets 503 SCRAPES_IN_FLIGHT.
 * A client that reads, however slowly, keeps its response.
 */
class ScrapeBudget {
  readonly #limit: number
  #held = 0
  /** Responses holding a body, oldest first: its size, the bytes still pending at the last look, and when they last went down. */
  readonly #holders = new Map<ServerResponse, { bytes: number; pending: number; queued: number; progressAt: number; cut: (() => void) | undefined }>()
  /**
   * The last body's size, plain and gzip apart (a gzip body is some 9× smaller): what a scrape
   * about to render will most likely need.
   */
  #expected = { plain: 0, gzip: 0 }
  /** Scrapes admitted but not rendered yet: what each is expected to hold (renders queue one behind another). */
  readonly #reservations = new Map<ServerResponse, number>()
  /** Their sum. */
  #reserved = 0

  constructor(limit: number) {
    this.#limit = limit
  }

  /**
   * Whether `res`'s scrape may render: there is room for a body like the last of its encoding
   * beside those held and those of scrapes admitted before it, after cutting stalled clients. Its
   * room is reserved then (until hold() or release()), so scrapes that come together do not all
   * find the room that is there before any of them has rendered. With nothing held or reserved,
   * always: the bound is on bodies held together, and a body larger than it alone must not shut
   * /metrics off (nor would a refusal ever learn that the body has become smaller: only a
   * rendered scrape measures it).
   */
  admit(res: ServerResponse, encoding: 'plain' | 'gzip', now = Date.now()): boolean {
    const expected = this.#expected[encoding]
    const room = (): boolean => this.#held + this.#reserved === 0 || this.#held + this.#reserved + expected <= this.#limit
    for (const [res, holder] of this.#holders) {
      if (room()) break
      const pending = res.socket?.writableLength ?? 0
      const queued = queuedBytes(res)
      if (pending < holder.pending || queued < holder.queued) {
        holder.pending = pending // the client read since the last look: it keeps its response
        holder.queued = queued
        holder.progressAt = now
      }
      if (pending === 0 || now - holder.progressAt < STALLED_MS) continue
      this.#release(res)
      res.destroy()
      // Closed: nothing writes from the body any more, and its memory can serve the next scrape.
      holder.cut?.()
    }
    if (!room()) return false
    this.#reservations.set(res, expected)
    this.#reserved += expected
    return true
  }

  /** The room admit() reserved for `res` back, if it still has it (HEAD, a failed or abandoned render). */
  release(res: ServerResponse): void {
    const reserved = this.#reservations.get(res)
    if (reserved === undefined) return
    this.#reservations.delete(res)
    this.#reserved -= reserved
  }

  /** `res` holds a body of `bytes` instead of its room reserved, until it closes (finished, or cut: then `cut` is called). */
  hold(res: ServerResponse, encoding: 'plain' | 'gzip', bytes: number, cut?: () => void): void {
    this.release(res)
    this.#expected[encoding] = bytes
    if (res.destroyed || typeof res.once !== 'function') return
    this.#held += bytes
    this.#holders.set(res, { bytes, pending: Infinity, queued: Infinity, progressAt: Date.now(), cut })
    res.once('close', () => this.#release(res))
  }

  #release(res: ServerResponse): void {
    const holder = this.#holders.get(res)
    if (holder === undefined) return
    this.#holders.delete(res)
    this.#held -= holder.bytes
  }
}

/**
 * The request handler for the broker's own node:http server. Returns true when it handled the
 * request (one of the three paths, including its 4xx answers); false, without touching `res`, for
 * any other path — and for every path while metrics are disabled — so the broker's other routes
 * and its own 404 keep working.
 */
export function createHandler(host: HttpHost): (req: IncomingMessage, res: ServerResponse) => boolean {
  if (!host.enabled) return () => false
  const isAuthorized = authorizer(host.authToken)
  const budget = new ScrapeBudget((host.limits ?? DEFAULT_LIMITS).maxScrapeBytes)
  // /stats answers have a budget of their own, as large: without it a client that never reads
  // (or pipelines requests) made the broker hold one whole answer per request (docs/http.md).
  const answers = new ScrapeBudget((host.limits ?? DEFAULT_LIMITS).maxScrapeBytes)
  return (req, res) => {
    const raw = req.url ?? ''
    const target = originForm(raw)
    const query = target.indexOf('?')
    const path = query < 0 ? target : target.slice(0, query)
    if (!ROUTES.has(path)) return false
    if (raw.length > MAX_URL_LENGTH) {
      sendError(req, res, 414, 'URI_TOO_LONG', `request target is ${raw.length} bytes; the limit is ${MAX_URL_LENGTH}`)
    } else if (req.method !== 'GET' && req.method !== 'HEAD') {
      sendError(req, res, 405, 'METHOD_NOT_ALLOWED', `${path} accepts GET and HEAD, not ${req.method}`, { Allow: ALLOW })
    } else if (hasBody(req)) {
      sendError(req, res, 413, 'BODY_NOT_ALLOWED', `${path} accepts no request body`)
    } else if (!isAuthorized(req.headers.authorization)) {
      sendError(req, res, 401, 'UNAUTHORIZED', 'a valid "Authorization: Bearer <token>" header is required', { 'WWW-Authenticate': 'Bearer' })
    } else {
      serve(host, budget, answers, path as Route, query < 0 ? '' : target.slice(query + 1), req, res)
    }
    return true
  }
}

/**
 * The request target in origin form (path and query). RFC 9112 §3.2.2: a server must accept the
 * absolute form too (`GET http://host:9464/metrics HTTP/1.1`, as a proxy sends it); its path and
 * query are what count, and the authority is the Host's business.
 */
export function originForm(target: string): string {
  if (target.charCodeAt(0) === 0x2f /* '/' */) return target
  const authority = /^https?:\/\/[^/?#]*/i.exec(target)
  if (authority === null) return target
  const rest = target.slice(authority[0].length)
  return rest.charCodeAt(0) === 0x2f ? rest : `/${rest}`
}

/** Standalone server: the three endpoints, 404 for every other path. */
export function listen(host: HttpHost, options: ListenOptions = {}): Promise<HttpListening> {
  if (!host.enabled) {
    return Promise.reject(new UsageError('METRICS_DISABLED', 'mq-metrics: metrics_enabled is false, so nothing is served and no port is opened'))
  }
  let port: number
  let hostname: string
  try {
    ;({ port, hostname } = listenOptions(options))
  } catch (error) {
    return Promise.reject(error)
  }
  const handle = createHandler(host)
  const maxConnections = (host.limits ?? DEFAULT_LIMITS).maxConnections
  /** Sockets past the connection cap: each request on them gets a fast 503, then the socket closes. */
  const overCap = new WeakSet<Socket>()
  const server = createServer(
    // requireHostHeader: Node's own answer to a missing Host is an empty 400; ours is JSON (below).
    { maxHeaderSize: MAX_HEADER_SIZE, connectionsCheckingInterval: TIMEOUT_CHECK_INTERVAL_MS, requireHostHeader: false },
    (req, res) => {
      lastResponse.set(req.socket, res) // pipelined requests are answered in order: this one's goes out last
      if (overCap.has(req.socket)) {
        sendError(req, res, 503, 'TOO_MANY_CONNECTIONS', `this server holds at most ${maxConnections} connections; try again shortly`, { 'Retry-After': String(RETRY_AFTER_SECONDS), Connection: 'close' })
        return
      }
      // RFC 9112 §3.2: an HTTP/1.1 request without Host is a 400 — as JSON, like every error here.
      if (req.httpVersion === '1.1' && req.headers.host === undefined) {
        sendError(req, res, 400, 'MISSING_HOST', 'an HTTP/1.1 request needs a Host header', { Connection: 'close' })
        return
      }
      if (handle(req, res)) return
      const target = req.url ?? ''
      if (target.length > MAX_URL_LENGTH) {
        sendError(req, res, 414, 'URI_TOO_LONG', `request target is ${target.length} bytes; the limit is ${MAX_URL_LENGTH}`)
      } else {
        const path = originForm(target).split('?', 1)[0]
        sendError(req, res, 404, 'NOT_FOUND', `no such path: ${path.length > 100 ? path.slice(0, 100) + '…' : path}; this server serves /metrics, /healthz and /stats`)
      }
    },
  )
  server.headersTimeout = HEADERS_TIMEOUT_MS
  server.requestTimeout = REQUEST_TIMEOUT_MS
  server.keepAliveTimeout = KEEP_ALIVE_TIMEOUT_MS
  server.setTimeout(SOCKET_IDLE_TIMEOUT_MS) // no 'timeout' listener: Node destroys the socket
  server.on('clientError', onClientError)
  let connections = 0
  server.on('connection', (socket: Socket) => {
    if (++connections > maxConnections) overCap.add(socket)
    socket.once('close', () => connections--)
  })
  // An Expect other than 100-continue: Node's own answer is an empty 417; ours is JSON.
  server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    sendError(req, res, 417, 'EXPECTATION_FAILED', `this server meets no expectation but 100-continue, not ${JSON.stringify(String(req.headers.expect).slice(0, 100))}`, { Connection: 'close' })
  })
  // Without a 'connect' listener Node drops a CONNECT request without a word; it is a method like
  // any other that these endpoints do not accept.
  server.on('connect', (_req: IncomingMessage, socket: Duplex) => {
    // Node hands the socket over without its error handler: a reset must not become an uncaught error.
    socket.on('error', () => socket.destroy())
    rawError(socket, 405, 'Method Not Allowed', 'METHOD_NOT_ALLOWED', 'this server accepts GET and HEAD, not CONNECT', `Allow: ${ALLOW}\r\n`)
  })

  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, hostname, () => {
      server.off('error', reject)
      const address = server.address()
      if (address === null || typeof address === 'string') {
        server.close()
        reject(new Error(`mq-metrics: unexpected server address ${String(address)}`))
        return
      }
      const urlHost = address.family === 'IPv6' || address.address.includes(':') ? `[${address.address}]` : address.address
      resolve({
        port: address.port,
        host: address.address,
        url: `http://${urlHost}:${address.port}`,
        close: closer(server),
      })
    })
  })
}

function listenOptions(options: ListenOptions): { port: number; hostname: string } {
  if (!isPlainObject(options)) {
    throw new TypeError(`listen options must be an object, got ${describe(options)}`)
  }
  for (const key of Object.keys(options)) {
    // A typo (`hostname`) must not quietly bind the default address instead.
    if (key !== 'port' && key !== 'host') throw new TypeError(`unknown listen option ${JSON.stringify(key)} (known: port, host)`)
  }
  // A key left out takes its default; null is a bad value, as in the configuration (config.ts).
  // api.md: a TypeError for what is not a number, a RangeError for a number out of range.
  const port = ownOption(options, 'port', DEFAULT_PORT)
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 0 || port > 65535) {
    throw new (typeof port === 'number' ? RangeError : TypeError)(`listen port must be an integer from 0 to 65535, got ${describe(port)}`)
  }
  const hostname = ownOption(options, 'host', DEFAULT_HOST)
  if (typeof hostname !== 'string' || hostname.length === 0) {
    throw new TypeError(`listen host must be a non-empty string, got ${describe(hostname)}`)
  }
  return { port, hostname }
}

function closer(server: Server): () => Promise<void> {
  let closing: Promise<void> | undefined
  return () => {
    closing ??= new Promise<void>((resolve) => {
      server.close(() => resolve())
      server.closeAllConnections() // keep-alive and in-flight sockets too, not just new ones
    })
    return closing
  }
}

// --- endpoints ----------------------------------------------------------------------------------

function serve(host: HttpHost, budget: ScrapeBudget, answers: ScrapeBudget, route: Route, query: string, req: IncomingMessage, res: ServerResponse): void {
  if (route !== '/healthz') serverAtWork(req, res)
  try {
    if (route === '/metrics') {
      const encoding = acceptsGzip(req.headers['accept-encoding']) ? 'gzip' : 'plain'
      if (!budget.admit(res, encoding)) {
        sendError(req, res, 503, 'SCRAPES_IN_FLIGHT', 'too many /metrics bodies are still being sent; try again shortly', { 'Retry-After': String(RETRY_AFTER_SECONDS) })
        return
      }
      // A body is handed back once: after 'finish', after gzip consumed it, or when its client is
      // cut — and Node emits 'finish' on a response it destroyed too, after the cut: a second
      // hand-back would give the memory of a body still being written to a later scrape.
      let handedBack = false
      const sent = host.metricsSent === undefined ? undefined : (rendered: Buffer): void => {
        if (handedBack) return
        handedBack = true
        host.metricsSent!(rendered)
      }
      const answer = (metrics: Buffer | GzipBody): void => {
        const body = Buffer.isBuffer(metrics) ? metrics : metrics.gzip ?? metrics.plain
        if (req.method !== 'HEAD') budget.hold(res, encoding, body.length, Buffer.isBuffer(metrics) && sent !== undefined ? () => sent(metrics) : undefined)
        else budget.release(res)
        if (Buffer.isBuffer(metrics)) respond(host, req, res, 200, METRICS_CONTENT_TYPE, metrics, sent)
        else if (metrics.gzip === undefined) respond(host, req, res, 200, METRICS_CONTENT_TYPE, metrics.plain, sent)
        else send(req, res, 200, { 'Content-Type': METRICS_CONTENT_TYPE, Vary: 'Accept-Encoding', 'Content-Encoding': 'gzip' }, metrics.gzip)
      }
      const abandoned = (): boolean => res.destroyed === true
      let metrics: ReturnType<HttpHost['metricsBody']> | ReturnType<NonNullable<HttpHost['metricsGzip']>>
      try {
        metrics = host.metricsGzip !== undefined && encoding === 'gzip' ? host.metricsGzip(abandoned) : host.metricsBody(abandoned)
      } catch (error) {
        budget.release(res)
        throw error
      }
      // A skipped scrape has nobody to answer and is no error.
      if ('then' in metrics) {
        metrics.then(answer, (error: unknown) => {
          budget.release(res)
          if (!(error instanceof ScrapeAbandoned)) failed(host, req, res, error)
        })
      } else answer(metrics)
      return
    }
    // A /stats view's lists are built and written in slices, the event loop free between them;
    // another answer (an error, /healthz) is written at once.
    // A /stats answer is built only with room for it beside those still being sent (a stalled
    // client's is cut, as for /metrics); /healthz, small and what probes restart brokers by, always.
    const budgeted = route === '/stats'
    if (budgeted && !answers.admit(res, 'plain')) {
      sendError(req, res, 503, 'ANSWERS_IN_FLIGHT', 'too many /stats answers are still being sent; try again shortly', { 'Retry-After': String(RETRY_AFTER_SECONDS) })
      return
    }
    const written = (statusCode: number, body: Buffer | JsonChunks): void => {
      if (budgeted && req.method !== 'HEAD') answers.hold(res, 'plain', body.length)
      else if (budgeted) answers.release(res)
      respond(host, req, res, statusCode, JSON_CONTENT_TYPE, body)
    }
    const json = (answer: { statusCode: number; body: unknown }): Promise<void> | void => {
      if (Buffer.isBuffer(answer.body) || answer.body instanceof JsonChunks) return written(answer.statusCode, answer.body) // written as JSON already (the scrape thread's)
      // A client gone meanwhile: the rest is not built (nobody to answer).
      const body = toJSONSliced(answer.body, SLICE_HOLD_MS, { ...IMMEDIATE_SLICES, gone: () => res.destroyed === true })
      if (Buffer.isBuffer(body)) return written(answer.statusCode, body)
      return body.then((built) => { if (built !== undefined) written(answer.statusCode, built); else answers.release(res) })
    }
    const fail = (error: unknown): void => {
      answers.release(res)
      if (!(error instanceof ScrapeAbandoned)) failed(host, req, res, error) // else nobody to answer
    }
    const answer = route === '/healthz' ? host.healthz() : host.stats(new URLSearchParams(query), () => res.destroyed === true)
    if ('then' in answer) answer.then(json).catch(fail)
    else json(answer)?.catch(fail)
  } catch (error) {
    answers.release(res)
    failed(host, req, res, error)
  }
}

/**
 * A request the surface could not answer: 503 SURFACE_CLOSED once the surface is closed (a
 * mounted handler outlives it: the broker's server keeps running), else 500 INTERNAL.
 */
function failed(host: HttpHost, req: IncomingMessage, res: ServerResponse, error: unknown): void {
  if ((error as { code?: unknown } | null)?.code === 'SURFACE_CLOSED') {
    sendError(req, res, 503, 'SURFACE_CLOSED', 'this mq-metrics surface is closed')
    return
  }
  internalError(host, req, res, error)
}

/**
 * Sends `body`, gzipped when the client accepts it and it is large enough. `done(body)`, when
 * given, is called once nothing reads `body` any more: after gzip consumed it, or once the
 * response was handed to the OS ('finish'). A response whose client the scrape budget cuts hands
 * it back at the cut (serve(), which calls `done` once); one whose client went away otherwise
 * leaves the buffer to the garbage collector.
 */
function respond(
  host: HttpHost, req: IncomingMessage, res: ServerResponse, statusCode: number, contentType: string, body: Buffer | JsonChunks,
  done?: (body: Buffer) => void,
): void {
  const headers: Record<string, string | number> = { 'Content-Type': contentType, Vary: 'Accept-Encoding' }
  if (body.length < GZIP_MIN_BYTES || !acceptsGzip(req.headers['accept-encoding'])) {
    const written = send(req, res, statusCode, headers, body)
    if (done === undefined || !Buffer.isBuffer(body)) return
    if (!written) done(body)
    else if (typeof res.once === 'function') res.once('finish', () => done(body))
    return
  }
  if (body instanceof JsonChunks) {
    // Part by part through one gzip stream, on the thread pool as below.
    gzipChunks(body, (error, compressed) => {
      if (error) internalError(host, req, res, error)
      else send(req, res, statusCode, { ...headers, 'Content-Encoding': 'gzip' }, compressed!)
    })
    return
  }
  // Off the event loop: a large scrape compresses on the thread pool while the broker runs on.
  gzip(body, { level: GZIP_LEVEL }, (error, compressed) => {
    done?.(body)
    if (error) {
      internalError(host, req, res, error)
      return
    }
    headers['Content-Encoding'] = 'gzip'
    send(req, res, statusCode, headers, compressed)
  })
}

function internalError(host: HttpHost, req: IncomingMessage, res: ServerResponse, error: unknown): void {
  try {
    host.reportError?.(error)
  } catch {
    // The 500 below still goes out; a broken error reporter must not take the request with it.
  }
  const reason = error instanceof Error ? error.message : describe(error)
  sendError(req, res, 500, 'INTERNAL', `internal error: ${reason}`)
}

// --- request checks -----------------------------------------------------------------------------

/** Bodies are refused, unread (design §7): announced by Content-Length > 0 or any Transfer-Encoding. */
function hasBody(req: IncomingMessage): boolean {
  if (req.headers['transfer-encoding'] !== undefined) return true
  const length = req.headers['content-length']
  return length !== undefined && Number(length) !== 0
}

/**
 * design §7: constant-time comparison. Both sides are hashed first so that timingSafeEqual always
 * compares 32 bytes: neither the token's length nor its content leaks through timing.
 */
function authorizer(token: string | undefined): (header: string | undefined) => boolean {
  if (token === undefined) return () => true
  const expected = sha256(token)
  return (header) => {
    if (typeof header !== 'string') return false
    // RFC 7235: the scheme is case-insensitive; one or more spaces separate it from the token.
    const match = /^bearer +(.*)$/is.exec(header)
    if (match === null) return false
    const presented = match[1].trim()
    // An empty configured token never matches: an empty credential is no credential.
    return timingSafeEqual(sha256(presented), expected) && presented.length > 0
  }
}

function sha256(text: string): Buffer {
  return createHash('sha256').update(text, 'utf8').digest()
}

/**
 * RFC 9110 §12.5.3: gzip is acceptable when `gzip` (or `x-gzip`) has q > 0, or, when it is not
 * named, `*` has q > 0. `gzip;q=0` refuses it.
 */
export function acceptsGzip(header: string | string[] | undefined): boolean {
  if (header === undefined) return false
  const value = Array.isArray(header) ? header.join(',') : header
  let gzipQ: number | undefined
  let starQ: number | undefined
  for (const element of value.split(',')) {
    const [coding, ...params] = element.split(';').map((part) => part.trim())
    const name = coding.toLowerCase()
    if (name !== 'gzip' && name !== 'x-gzip' && name !== '*') continue
    let q = 1
    for (const param of params) {
      const eq = param.indexOf('=')
      if (eq < 0 || param.slice(0, eq).trim().toLowerCase() !== 'q') continue
      q = parseQValue(param.slice(eq + 1).trim())
    }
    if (name === '*') starQ = Math.max(starQ ?? 0, q)
    else gzipQ = Math.max(gzipQ ?? 0, q)
  }
  if (gzipQ !== undefined) return gzipQ > 0
  return starQ !== undefined && starQ > 0
}

/** RFC 9110 §12.4.2: qvalue = 0[.ddd] / 1[.000]. Anything else counts as 0 (not acceptable). */
function parseQValue(text: string): number {
  return /^(?:0(?:\.\d{0,3})?|1(?:\.0{0,3})?)$/.test(text) ? Number(text) : 0
}

// --- responses ----------------------------------------------------------------------------------

/** True when `body` went to `res` (false: the response was already sent or destroyed, or HEAD). */
function send(req: IncomingMessage, res: ServerResponse, statusCode: number, headers: Record<string, string | number>, body: Buffer | JsonChunks): boolean {
  clientsTurn(res)
  if (res.headersSent || res.destroyed) return false
  res.statusCode = statusCode
  for (const [name, value] of Object.entries(headers)) res.setHeader(name, value)
  res.setHeader('Content-Length', body.length)
  res.setHeader('Cache-Control', 'no-store')
  res.setHeader('X-Content-Type-Options', 'nosniff')
  // A request body is never read: close the connection rather than parse it as the next request.
  if (hasBody(req)) res.setHeader('Connection', 'close')
  if (req.method === 'HEAD') {
    res.end()
    return false
  }
  if (body instanceof JsonChunks) {
    const last = body.parts.length - 1
    for (let i = 0; i < last; i++) res.write(body.parts[i])
    res.end(body.parts[last])
  } else res.end(body)
  return true
}

/** JsonChunks gzipped as one member, each part written to the stream in turn. */
function gzipChunks(body: JsonChunks, done: (error: Error | null, compressed?: JsonChunks) => void): void {
  const zip = createGzip({ level: GZIP_LEVEL })
  const out: Buffer[] = []
  zip.on('data', (part: Buffer) => out.push(part))
  zip.once('error', (error) => done(error))
  zip.once('end', () => done(null, new JsonChunks(out)))
  for (const part of body.parts) zip.write(part)
  zip.end()
}

function sendError(
  req: IncomingMessage,
  res: ServerResponse,
  statusCode: number,
  code: string,
  message: string,
  headers: Record<string, string> = {},
): void {
  const body = Buffer.from(toJSON({ error: { code, message } }), 'utf8')
  send(req, res, statusCode, { ...headers, 'Content-Type': JSON_CONTENT_TYPE }, body)
}

/** Per connection: its responses being prepared, and the idle timeout its socket had before the first. */
const atWork = new WeakMap<Socket, { responses: Set<ServerResponse>; timeout: number }>()
/** Each response being prepared: its connection (a response that closes may have let go of it). */
const preparing = new WeakMap<ServerResponse, Socket>()

/**
 * While a /metrics body or a /stats answer is prepared (a render paced on the scrape thread, its
 * gzip, a view built in slices), the client has nothing to do: the socket's idle timeout (ours
 * 30 s, or the broker's own server's when mounted) would cut it without an answer, and a 553 MB
 * body renders in ~20 s on a quiet machine. The timeout is off from the request until its answer
 * is written (clientsTurn), then as it was: it still drops a client that stops reading. Pipelined
 * requests on one connection: off until the last of them being prepared is written; a timeout a
 * mounted broker's own route set meanwhile is left as it set it.
 */
function serverAtWork(req: IncomingMessage, res: ServerResponse): void {
  const socket = req.socket // a pipelined request's response has no socket until those before it are written
  if (socket == null || typeof socket.setTimeout !== 'function') return
  let work = atWork.get(socket)
  if (work === undefined) {
    const timeout = socket.timeout ?? 0
    if (timeout === 0) return // no idle timeout to hold off
    work = { responses: new Set(), timeout }
    atWork.set(socket, work)
    socket.setTimeout(0)
  }
  work.responses.add(res)
  preparing.set(res, socket)
  res.once('close', () => clientsTurn(res)) // answered or not, it is done
}

/** `res`'s answer is about to be written: its socket's idle timeout applies again (serverAtWork). */
function clientsTurn(res: ServerResponse): void {
  const socket = preparing.get(res)
  if (socket === undefined) return
  preparing.delete(res)
  const work = atWork.get(socket)
  if (work === undefined || !work.responses.delete(res) || work.responses.size > 0) return
  atWork.delete(socket)
  // Unless the broker's own route, pipelined behind, has set the timeout its way meanwhile (to
  // anything but 0: a 0 it set cannot be told from this one).
  if (!socket.destroyed && (socket.timeout ?? 0) === 0) socket.setTimeout(work.timeout)
}

const CLIENT_ERROR_STATUS: Record<string, [number, string, string]> = {
  HPE_HEADER_OVERFLOW: [431, 'Request Header Fields Too Large', 'HEADERS_TOO_LARGE'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'Request Timeout', 'REQUEST_TIMEOUT'],
}
const URI_TOO_LONG: [number, string, string] = [414, 'URI Too Long', 'URI_TOO_LONG']
const METHOD_NOT_ALLOWED: [number, string, string] = [405, 'Method Not Allowed', 'METHOD_NOT_ALLOWED']

type ClientError = Error & { code?: string; rawPacket?: Buffer; bytesParsed?: number }
/** Sockets whose parse error waits for the responses under way to go out (onClientError). */
const closingAfter = new WeakSet<Socket>()
/** Each connection's latest request's response: Node writes pipelined responses in order, so it goes out last. */
const lastResponse = new WeakMap<Socket, ServerResponse>()

/**
 * A request Node could not parse, or one that timed out: a JSON error on the raw socket, then it
 * closes. The good requests before it on the connection (pipelined, or /metrics and /healthz
 * still being read) are answered first, whole and in order: the error is written once the last
 * of their responses has gone out (before, it would corrupt them). If one of them cannot go out
 * whole (its client gone, a response cut), the connection just closes.
 */
function onClientError(error: ClientError, socket: Socket): void {
  if (closingAfter.has(socket)) return // read nothing more meanwhile: each packet would be another parse error
  const [status, reason, code] = clientErrorStatus(error)
  const answer = (): void => {
    if (error.code !== 'ECONNRESET' && socket.writable) {
      rawError(socket, status, reason, code, `${reason.toLowerCase()} (${error.code ?? error.message})`, status === 405 ? `Allow: ${ALLOW}\r\n` : '')
    } else {
      socket.destroy()
    }
  }
  const last = lastResponse.get(socket)
  if (last === undefined || last.writableFinished || error.code === 'ECONNRESET') return answer()
  closingAfter.add(socket)
  socket.pause()
  if (last.destroyed) return void socket.destroy()
  let finished = false
  last.once('finish', () => {
    finished = true
    answer()
  })
  last.once('close', () => { if (!finished) socket.destroy() })
}

/**
 * Node counts the request line against maxHeaderSize, so a request target past 16 KiB arrives
 * here as a header overflow; and llhttp refuses a method it does not know before any handler runs.
 * Both are told apart by the bytes of the request head that overflowed or failed (`rawPacket`,
 * the chunk being parsed): a head whose first line never ended is an overlong target (414), and
 * a method that is a well-formed token is a method we do not serve (405). A client that trickles
 * its target in small packets may leave the start of the line in an earlier packet: that one is
 * answered 431, still a 4xx.
 */
function clientErrorStatus(error: ClientError): [number, string, string] {
  const packet = error.rawPacket
  if (packet !== undefined && (error.code === 'HPE_HEADER_OVERFLOW' || error.code === 'HPE_INVALID_METHOD')) {
    const at = Math.min(packet.length, error.bytesParsed ?? packet.length)
    // The head being parsed starts after the last blank line before the error (an earlier
    // pipelined request ends there).
    const blank = packet.subarray(0, at).lastIndexOf('\r\n\r\n')
    const start = blank < 0 ? 0 : blank + 4
    const head = packet.subarray(start, start + MAX_URL_LENGTH + 64).toString('latin1')
    const method = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32} /.test(head)
    if (error.code === 'HPE_HEADER_OVERFLOW' && method && !packet.subarray(start, at).includes(0x0a)) return URI_TOO_LONG
    // A whole request line (method, target, version) with a method llhttp does not know; anything
    // else (TLS bytes, "THIS IS NOT HTTP") stays a 400.
    if (error.code === 'HPE_INVALID_METHOD' && /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32} [\x21-\x7e]+ HTTP\/\d\.\d\r?\n/.test(head)) return METHOD_NOT_ALLOWED
  }
  return CLIENT_ERROR_STATUS[error.code ?? ''] ?? [400, 'Bad Request', 'BAD_REQUEST']
}

/** A JSON error written straight to a socket Node's HTTP layer no longer serves; then closed. */
function rawError(socket: Duplex, status: number, reason: string, code: string, message: string, extraHeaders = ''): void {
  const body = toJSON({ error: { code, message } })
  socket.end(
    `HTTP/1.1 ${status} ${reason}\r\n` +
      extraHeaders +
      `Content-Type: ${JSON_CONTENT_TYPE}\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n` +
      'Cache-Control: no-store\r\n' +
      'Connection: close\r\n\r\n' +
      body,
  )
  // A peer that never closes its side (a client that stopped reading, a slowloris) would keep the
  // connection, and a maxConnections slot, until the idle timeout (30 s): it has a second to read.
  const linger = setTimeout(() => socket.destroy(), RAW_ERROR_LINGER_MS)
  linger.unref()
  socket.once('close', () => clearTimeout(linger))
}
