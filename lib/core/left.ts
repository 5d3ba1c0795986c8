// When a group leaves a topic (removeGroup()), /metrics shows the topic's groups without their
// mq_group_retries_total series for LEFT_MS: the mark by which the conservation alert tells a
// window that a departed group's deliveries may fall in (docs/metrics.md, "A group that left").
// The time is kept in the topic's own block (entities.ts T_GROUP_LEFT), so every thread and every
// scrape sees it, whoever removed the group and whenever the scraping thread started.

/**
 * How long after a group leaves its topic's groups show no retries series: Prometheus' default
 * lookback, so a scraper that scrapes at least that often sees the mark at least once.
 */
export const LEFT_MS = 5 * 60_000

/**
 * The clock of the mark: wall-clock ms from this thread's time origin on, monotonic within a thread
 * and the same across the threads of a process to within the clock's adjustments. Tests replace `now`.
 */
export const leftClock = { now: (): number => performance.timeOrigin + performance.now() }

/** Whether a topic whose T_GROUP_LEFT cell holds `left` had a group leave within LEFT_MS of `now`. */
export function leftLately(left: number, now: number): boolean {
  return left !== 0 && now - left < LEFT_MS && left - now < LEFT_MS
}
