// The second argument of createSurface(): the options that tune how the endpoints share the
// broker's process (pacing, the scrape thread, the server's limits), checked once.
import { ownFields } from '../core/config'
import { ConfigError } from '../core/errors'
import { describe } from '../core/labels'

/** The second argument of createSurface(): how the endpoints share the main thread with the broker. */
export interface SurfaceOptions {
  /** The share of the main thread that /metrics work may take when scrapes come back to back, from 0.01 to 1; 1: unpaced. Default 0.3. */
  scrapeShare?: number
  /** How much scrape work (ms of the main thread) may run unpaced after a pause. Default 50. */
  scrapeBurstMs?: number
  /** Connections the standalone server holds at once; past it a request gets 503 TOO_MANY_CONNECTIONS. Default 1024. */
  maxConnections?: number
  /**
   * Bytes of /metrics bodies that responses still being written may hold, together; past it the
   * responses of clients that stopped reading are cut, oldest first, or a scrape gets 503
   * SCRAPES_IN_FLIGHT. /stats answers have a budget of their own, as large (503
   * ANSWERS_IN_FLIGHT). Default 64 MiB.
   */
  maxScrapeBytes?: number
  /**
   * Render /metrics in a thread of the library's own (docs/scrape-thread.md), so that a scrape holds
   * the broker's main thread only for the hand-off; the pacing above then shares that thread's
   * time. false: render on the main thread, paced. Default true.
   */
  scrapeThread?: boolean
}

export interface ResolvedSurfaceOptions {
  readonly scrapeShare: number
  readonly scrapeBurstMs: number
  readonly maxConnections: number
  readonly maxScrapeBytes: number
  readonly scrapeThread: boolean
}

export const DEFAULT_SCRAPE_SHARE = 0.3
export const DEFAULT_SCRAPE_BURST_MS = 50
const MAX_SCRAPE_BURST_MS = 60_000
const MIN_SCRAPE_SHARE = 0.01
export const DEFAULT_MAX_CONNECTIONS = 1024
export const DEFAULT_MAX_SCRAPE_BYTES = 64 * 2 ** 20
const OPTION_KEYS: readonly (keyof SurfaceOptions)[] = ['scrapeShare', 'scrapeBurstMs', 'maxConnections', 'maxScrapeBytes', 'scrapeThread']

/** Checks createSurface()'s options: unknown keys and values out of range are a ConfigError naming the key. */
export function resolveSurfaceOptions(input: unknown): ResolvedSurfaceOptions {
  // A key left out takes its default; null is a bad value, as in the configuration (config.ts).
  const own = ownFields(input, 'options', OPTION_KEYS, `unknown option (known options: ${OPTION_KEYS.join(', ')})`)
  const share = own('scrapeShare', DEFAULT_SCRAPE_SHARE)
  // Below 1%, one 10 ms slice would wait over a second: a scrape would time out before it ends.
  if (typeof share !== 'number' || !(share >= MIN_SCRAPE_SHARE && share <= 1)) {
    throw new ConfigError('scrapeShare', `must be a number from ${MIN_SCRAPE_SHARE} to 1 (1: unpaced), got ${describe(share)}`)
  }
  const burst = own('scrapeBurstMs', DEFAULT_SCRAPE_BURST_MS)
  if (typeof burst !== 'number' || !(burst >= 0 && burst <= MAX_SCRAPE_BURST_MS)) {
    throw new ConfigError('scrapeBurstMs', `must be a number from 0 to ${MAX_SCRAPE_BURST_MS}, got ${describe(burst)}`)
  }
  const maxConnections = own('maxConnections', DEFAULT_MAX_CONNECTIONS)
  if (typeof maxConnections !== 'number' || !Number.isInteger(maxConnections) || maxConnections < 1 || maxConnections > 65535) {
    throw new ConfigError('maxConnections', `must be an integer from 1 to 65535, got ${describe(maxConnections)}`)
  }
  const maxScrapeBytes = own('maxScrapeBytes', DEFAULT_MAX_SCRAPE_BYTES)
  if (typeof maxScrapeBytes !== 'number' || !Number.isSafeInteger(maxScrapeBytes) || maxScrapeBytes < 2 ** 16) {
    throw new ConfigError('maxScrapeBytes', `must be an integer from 65536 to ${Number.MAX_SAFE_INTEGER} (bytes), got ${describe(maxScrapeBytes)}`)
  }
  const scrapeThread = own('scrapeThread', true)
  if (typeof scrapeThread !== 'boolean') throw new ConfigError('scrapeThread', `must be true or false, got ${describe(scrapeThread)}`)
  return Object.freeze({ scrapeShare: share, scrapeBurstMs: burst, maxConnections, maxScrapeBytes, scrapeThread })
}
