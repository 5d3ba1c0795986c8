'use strict'
// Property tests for names and labels (design §2, §3): random Unicode topic and group names — lone
// surrogates, control characters, emoji, quotes and backslashes, 1,024-character names — are
// registered on a live surface, and every /metrics body must parse with the strict 0.0.4 parser
// below (written here, independent of lib/), carry only sanitized label values, hold no duplicate
// series and all 15 families in allowlist order; promtool must accept a sample of them; and /stats
// must show the raw names exactly. If this fails, some broker-chosen name can break the scrape
// for every series (Prometheus drops a whole scrape on one bad line) or lose its identity on /stats.
const t = require('tap')
const fc = require('fast-check')
const { spawnSync } = require('node:child_process')
const { backends, surfaceOn, request } = require('./helpers')

const NUM_RUNS = 200
const SEED = 20260421
/** Every PROMTOOL_EVERY-th run is also fed to `promtool check metrics`. */
const PROMTOOL_EVERY = 20

// design §2, written out again here rather than read from lib/exposition/allowlist.ts.
const FAMILIES = [
  ['mq_broker_uptime_seconds', 'gauge', []],
  ['mq_connections', 'gauge', []],
  ['mq_leader_epoch', 'gauge', []],
  ['mq_quorum_state', 'gauge', []],
  ['mq_topic_messages_produced_total', 'counter', ['topic']],
  ['mq_topic_messages_delivered_total', 'counter', ['topic']],
  ['mq_topic_messages_dropped_total', 'counter', ['topic']],
  ['mq_topic_messages_dlq_total', 'counter', ['topic']],
  ['mq_topic_bytes_total', 'counter', ['topic']],
  ['mq_partition_depth', 'gauge', ['topic', 'partition']],
  ['mq_partition_last_seq', 'gauge', ['topic', 'partition']],
  ['mq_group_lag', 'gauge', ['topic', 'group']],
  ['mq_group_in_flight', 'gauge', ['topic', 'group']],
  ['mq_group_retries_total', 'counter', ['topic', 'group']],
  ['mq_e2e_latency_ms', 'gauge', ['quantile']],
]

// --- a strict parser of the text exposition format 0.0.4 ----------------------------------------

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/
const VALUE = /^(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|NaN|[+-]Inf)$/
const TIMESTAMP = /^-?\d+$/
const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped'])

/** Unescapes a HELP docstring: only `\\` and `\n` are escapes there; any other backslash is an error. */
function unescapeHelp(text, where) {
  return text.replace(/\\(.?)/g, (_, c) => {
    if (c === '\\') return '\\'
    if (c === 'n') return '\n'
    throw new Error(`${where}: bad escape \\${c} in HELP`)
  })
}

/**
 * Parses a whole exposition strictly: `# HELP` / `# TYPE` comments (no other comment lines),
 * samples `name{label="value",...} value [timestamp]` with single spaces, label values with only
 * `\\`, `\"`, `\n` escapes, each family's HELP and TYPE at most once and before its samples, a
 * family's samples contiguous, no duplicate series, and the body ending in a newline. Returns
 * { families: [{ name, help, type, samples: [{ labels: [[k, v]], value }] }] } or throws.
 */
function parseExposition(text) {
  if (text.length > 0 && !text.endsWith('\n')) throw new Error('the body does not end with a newline')
  const lines = text.split('\n')
  lines.pop()
  const families = []
  const byName = new Map()
  const series = new Set()
  let current
  const familyOf = (name, where) => {
    if (current && current.name === name) return current
    if (byName.has(name)) throw new Error(`${where}: family ${name} appears in two places`)
    current = { name, help: undefined, type: undefined, samples: [] }
    byName.set(name, current)
    families.push(current)
    return current
  }
  lines.forEach((line, i) => {
    const where = `line ${i + 1} ${JSON.stringify(line.slice(0, 80))}`
    if (line === '') throw new Error(`${where}: empty line`)
    if (line.startsWith('#')) {
      const m = /^# (HELP|TYPE) ([^ ]+) (.*)$/s.exec(line)
      if (m === null) throw new Error(`${where}: a comment that is neither HELP nor TYPE`)
      const [, kind, name, rest] = m
      if (!METRIC_NAME.test(name)) throw new Error(`${where}: bad metric name`)
      const family = familyOf(name, where)
      if (family.samples.length > 0) throw new Error(`${where}: ${kind} after the family's samples`)
      if (kind === 'HELP') {
        if (family.help !== undefined) throw new Error(`${where}: second HELP`)
        family.help = unescapeHelp(rest, where)
      } else {
        if (family.type !== undefined) throw new Error(`${where}: second TYPE`)
        if (!TYPES.has(rest)) throw new Error(`${where}: unknown type ${rest}`)
        family.type = rest
      }
      return
    }
    // A sample.
    let at = 0
    const nameMatch = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line)
    if (nameMatch === null) throw new Error(`${where}: no metric name`)
    const name = nameMatch[0]
    at = name.length
    const labels = []
    if (line[at] === '{') {
      at++
      while (line[at] !== '}') {
        const labelMatch = /^[a-zA-Z_][a-zA-Z0-9_]*/.exec(line.slice(at))
        if (labelMatch === null) throw new Error(`${where}: bad label name at ${at}`)
        const labelName = labelMatch[0]
        if (labelName.startsWith('__')) throw new Error(`${where}: reserved label name ${labelName}`)
        at += labelName.length
        if (line[at] !== '=' || line[at + 1] !== '"') throw new Error(`${where}: expected =" after ${labelName}`)
        at += 2
        let value = ''
        for (;;) {
          const c = line[at]
          if (c === undefined) throw new Error(`${where}: unterminated label value`)
          if (c === '"') break
          if (c === '\\') {
            const e = line[at + 1]
            if (e === '\\') value += '\\'
            else if (e === '"') value += '"'
            else if (e === 'n') value += '\n'
            else throw new Error(`${where}: bad escape \\${e} in a label value`)
            at += 2
          } else {
            value += c
            at++
          }
        }
        at++ // the closing quote
        if (labels.some(([k]) => k === labelName)) throw new Error(`${where}: label ${labelName} twice`)
        labels.push([labelName, value])
        if (line[at] === ',') at++
        else if (line[at] !== '}') throw new Error(`${where}: expected , or } at ${at}`)
      }
      at++
    }
    if (line[at] !== ' ') throw new Error(`${where}: expected one space before the value`)
    const fields = line.slice(at + 1).split(' ')
    if (fields.length > 2 || !VALUE.test(fields[0]) || (fields.length === 2 && !TIMESTAMP.test(fields[1]))) {
      throw new Error(`${where}: bad value or timestamp`)
    }
    const family = familyOf(name, where)
    if (family.type === undefined) throw new Error(`${where}: sample before its TYPE`)
    const key = name + JSON.stringify([...labels].sort((a, b) => (a[0] < b[0] ? -1 : 1)))
    if (series.has(key)) throw new Error(`${where}: duplicate series`)
    series.add(key)
    family.samples.push({ labels, value: fields[0] })
  })
  return { families }
}

/** design §3.1, independently: per code point (a lone surrogate is one), anything outside [A-Za-z0-9_-] → `_`. */
function sanitize(raw) {
  let out = ''
  for (const ch of raw) out += /^[A-Za-z0-9_-]$/.test(ch) ? ch : '_'
  return out
}

// --- generators ----------------------------------------------------------------------------------

const unit = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom(...'abcxyzABCXYZ0189_-') },
  { weight: 2, arbitrary: fc.integer({ min: 0, max: 0x1f }).map((c) => String.fromCharCode(c)) }, // control characters
  { weight: 2, arbitrary: fc.integer({ min: 0xd800, max: 0xdfff }).map((c) => String.fromCharCode(c)) }, // lone surrogates
  { weight: 2, arbitrary: fc.constantFrom('\u{1F600}', '\u{1F4C8}', '\u{1F469}\u200d\u{1F469}\u200d\u{1F467}', '\u{10FFFF}', '\u{1F1FA}\u{1F1F8}', '\u00e9', 'e\u0301', '\u4e2d') },
  { weight: 3, arbitrary: fc.constantFrom('"', '\\', '\n', '\r', '\t', '{', '}', '=', ',', ' ', '#', ':', '.', '/', '\u2028', '\u0085', '\u00a0', '\ufeff', '\u202e', '\x7f', '\\n', '\\"', '"}', '\n# TYPE x counter\n') },
  { weight: 2, arbitrary: fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }) },
)

/** A name the API accepts: 1 to 1,024 UTF-16 units (design §3.6), often exactly 1,024. */
const name = fc.oneof(
  { weight: 10, arbitrary: fc.array(unit, { minLength: 1, maxLength: 24 }).map((parts) => parts.join('').slice(0, 1024)) },
  { weight: 1, arbitrary: fc.array(unit, { minLength: 1, maxLength: 8 }).map((parts) => parts.join('').repeat(1024).slice(0, 1024)) },
  // Distinct raw names that all sanitize to `a_b` (design §3.5 collisions).
  { weight: 3, arbitrary: fc.constantFrom('a.b', 'a/b', 'a b', 'a_b', 'a\ud800b', 'a\udfffb', 'a\u{1F600}b', 'a\nb', 'a"b', 'a\\b', 'a\u00e9b') },
)

const scenario = fc.record({
  topics: fc.uniqueArray(
    fc.record({
      name,
      groups: fc.uniqueArray(name, { maxLength: 3 }),
      partitions: fc.uniqueArray(fc.integer({ min: 0, max: 9 }), { maxLength: 4 }),
      produced: fc.integer({ min: 1, max: 1000 }),
    }),
    { minLength: 1, maxLength: 6, selector: (x) => x.name },
  ),
  latency: fc.boolean(),
})

// --- helpers ---------------------------------------------------------------------------------------

const get = (port, path) => request(port, { path })

// promtool is optional locally (skipped) and required in CI, as in render.test.js.
const PROMTOOL = process.env.PROMTOOL || 'promtool'
const promtoolMissing = Boolean(spawnSync(PROMTOOL, ['--version'], { encoding: 'utf8' }).error)
if (promtoolMissing && process.env.CI) throw new Error(`CI: ${PROMTOOL} is not installed (apt-get install prometheus)`)
// The findings design §2 forces on mq_e2e_latency_ms (see render.test.js); promtool lints only
// families with samples, so these appear exactly when latency samples do.
const FORCED_FINDINGS = [
  'mq_e2e_latency_ms metric names should not contain abbreviated units',
  'mq_e2e_latency_ms non-summary metrics should not have "quantile" label',
  'mq_e2e_latency_ms non-summary metrics should not have "quantile" label',
  'mq_e2e_latency_ms non-summary metrics should not have "quantile" label',
]

for (const backend of backends()) {
  t.test(`${backend}: random Unicode names → strict 0.0.4, sanitized labels, no duplicates, raw names on /stats`, async (t) => {
    const surface = surfaceOn(t, backend, { e2e_latency: true })
    const server = await surface.listen({ port: 0 })
    let runs = 0
    let promtoolRuns = 0
    let failure
    const seen = { names: 0, loneSurrogates: 0, controls: 0, astral: 0, longest: 0, of1024: 0, collidingRuns: 0, latencyRuns: 0 }

    const property = fc.asyncProperty(scenario, async ({ topics, latency }) => {
      runs++
      const all = topics.flatMap((x) => [x.name, ...x.groups])
      seen.names += all.length
      seen.loneSurrogates += all.filter((n) => /\p{Surrogate}/u.test(n)).length
      seen.controls += all.filter((n) => /[\x00-\x1f\x7f]/.test(n)).length
      seen.astral += all.filter((n) => /[\u{10000}-\u{10FFFF}]/u.test(n)).length
      seen.of1024 += all.filter((n) => n.length === 1024).length
      seen.longest = Math.max(seen.longest, ...all.map((n) => n.length))
      if (new Set(topics.map((x) => sanitize(x.name))).size < topics.length) seen.collidingRuns++
      if (latency) seen.latencyRuns++
      // Record: every topic produces on its partitions; each group dispatches and delivers some.
      const expected = new Map() // label → { produced, bytes, partitions:Set, groups: Map(label → retries) }
      for (const spec of topics) {
        const topic = surface.topic(spec.name)
        const label = sanitize(spec.name)
        const model = expected.get(label) ?? { produced: 0, bytes: 0, partitions: new Set(), groups: new Map() }
        expected.set(label, model)
        for (const p of spec.partitions) {
          topic.produced(p, spec.produced, 3 * spec.produced, spec.produced)
          model.produced += spec.produced
          model.bytes += 3 * spec.produced
          model.partitions.add(String(p))
        }
        for (const groupName of spec.groups) {
          const group = topic.group(groupName)
          group.dispatch(2)
          group.delivered(1)
          group.redelivered(1)
          const g = sanitize(groupName)
          model.groups.set(g, (model.groups.get(g) ?? 0) + 1)
        }
      }
      if (latency) for (let i = 1; i <= 50; i++) surface.latency.record(i)
      surface.latency.rotate() // the sealed window now holds this run's latency, or nothing

      try {
        const body = surface.render()
        const { families } = parseExposition(body)

        // All 15 families, HELP and TYPE, in allowlist order, and nothing else.
        if (families.map((f) => f.name).join() !== FAMILIES.map(([n]) => n).join()) throw new Error(`families: ${families.map((f) => f.name).join()}`)
        families.forEach((f, i) => {
          const [, type, labelNames] = FAMILIES[i]
          if (f.help === undefined || f.help === '') throw new Error(`${f.name}: no HELP`)
          if (f.type !== type) throw new Error(`${f.name}: TYPE ${f.type}, not ${type}`)
          for (const s of f.samples) {
            if (s.labels.map(([k]) => k).join() !== labelNames.join()) throw new Error(`${f.name}: labels ${s.labels.map(([k]) => k)} instead of ${labelNames}`)
            for (const [k, v] of s.labels) {
              if (k === 'quantile' ? !/^p(50|90|99)$/.test(v) : k === 'partition' ? !/^(0|[1-9]\d*)$/.test(v) : !/^[A-Za-z0-9_-]*$/.test(v)) {
                throw new Error(`${f.name}: label ${k}=${JSON.stringify(v)} is not sanitized`)
              }
            }
          }
        })
        const family = (n) => families.find((f) => f.name === n)
        const value = (n, ...labels) => family(n).samples.find((s) => s.labels.every(([, v], i) => v === labels[i]))?.value

        // Exactly the sanitized names, merged (design §3.5), with the merged numbers.
        const topicLabels = family('mq_topic_messages_produced_total').samples.map((s) => s.labels[0][1])
        if (topicLabels.join('\n') !== [...expected.keys()].sort().join('\n')) throw new Error(`topic labels ${JSON.stringify(topicLabels)} vs ${JSON.stringify([...expected.keys()])}`)
        for (const [label, model] of expected) {
          if (value('mq_topic_messages_produced_total', label) !== String(model.produced)) throw new Error(`${label}: produced`)
          if (value('mq_topic_bytes_total', label) !== String(model.bytes)) throw new Error(`${label}: bytes`)
          const partitions = family('mq_partition_last_seq').samples.filter((s) => s.labels[0][1] === label).map((s) => s.labels[1][1])
          if (partitions.sort().join() !== [...model.partitions].sort().join()) throw new Error(`${label}: partitions ${partitions}`)
          const groups = family('mq_group_retries_total').samples.filter((s) => s.labels[0][1] === label)
          if (groups.map((s) => s.labels[1][1]).join('\n') !== [...model.groups.keys()].sort().join('\n')) throw new Error(`${label}: groups`)
          for (const s of groups) if (s.value !== String(model.groups.get(s.labels[1][1]))) throw new Error(`${label}: retries of ${s.labels[1][1]}`)
        }
        const latencySamples = family('mq_e2e_latency_ms').samples.length
        if (latencySamples !== (latency ? 3 : 0)) throw new Error(`latency samples: ${latencySamples}`)

        // promtool, on a sample of the runs.
        if (!promtoolMissing && runs % PROMTOOL_EVERY === 0) {
          promtoolRuns++
          const run = spawnSync(PROMTOOL, ['check', 'metrics'], { input: body, encoding: 'utf8', timeout: 30_000 })
          const findings = `${run.stdout}${run.stderr}`.split('\n').map((l) => l.trim()).filter(Boolean)
          const want = latency ? FORCED_FINDINGS : []
          if (JSON.stringify(findings) !== JSON.stringify(want) || run.status !== (latency ? 3 : 0)) {
            throw new Error(`promtool (exit ${run.status}): ${findings.join(' | ')}`)
          }
        }

        // /stats: raw names exactly, through the API and through HTTP's JSON (lone surrogates
        // travel as \udXXX escapes and come back as the same UTF-16 string).
        const raw = topics.map((x) => x.name).sort()
        const viaApi = surface.stats('topics').topics.map((x) => x.topic).sort()
        if (JSON.stringify(viaApi) !== JSON.stringify(raw)) throw new Error('stats(topics) does not show the raw topic names')
        const response = await get(server.port, '/stats?filter=groups')
        const text = response.body.toString('utf8')
        if (!Buffer.from(text, 'utf8').equals(response.body)) throw new Error('/stats is not valid UTF-8')
        const viaHttp = JSON.parse(text).groups.map((g) => JSON.stringify([g.topic, g.group])).sort()
        const rawGroups = topics.flatMap((x) => x.groups.map((g) => JSON.stringify([x.name, g]))).sort()
        if (JSON.stringify(viaHttp) !== JSON.stringify(rawGroups)) throw new Error('/stats?filter=groups does not show the raw names')
        for (const spec of topics) {
          const narrowed = surface.stats('topics', { topic: spec.name }).topics
          if (narrowed.length !== 1 || narrowed[0].topic !== spec.name) throw new Error('stats narrowed by a raw name')
        }
        // Raw names that share a label are listed together (design §3.5).
        const collisions = surface.stats('collisions').topics
        for (const [label] of expected) {
          const names = topics.filter((x) => sanitize(x.name) === label).map((x) => x.name).sort()
          const listed = collisions.find((c) => c.label === label)
          if (names.length >= 2 ? JSON.stringify(listed?.names) !== JSON.stringify(names) : listed !== undefined) throw new Error(`collisions of ${label}`)
        }
      } catch (error) {
        failure ??= { error: error.message, topics: topics.map((x) => x.name) }
        throw error
      } finally {
        for (const spec of topics) surface.removeTopic(spec.name)
      }
      // Removed: no topic series left behind.
      const after = parseExposition(surface.render()).families
      if (after.some((f) => f.samples.some((s) => s.labels.some(([k]) => k === 'topic')))) throw new Error('series left after removeTopic')
    })

    const result = await fc.check(property, { numRuns: NUM_RUNS, seed: SEED, endOnFailure: true })
    t.equal(result.failed, false, `${NUM_RUNS} random scenarios (seed ${SEED}) render a strict, sanitized, duplicate-free exposition`,
      result.failed ? { counterexample: JSON.stringify(result.counterexample), failure } : {})
    t.equal(result.numRuns, NUM_RUNS, 'every run ran')
    t.comment(`${backend}: inputs tried: ${JSON.stringify(seen)}`)
    t.ok(seen.loneSurrogates > 0 && seen.controls > 0 && seen.astral > 0 && seen.of1024 > 0 && seen.collidingRuns > 0,
      'the generator reached lone surrogates, control characters, astral code points, 1,024-character names and collisions')
    if (promtoolMissing) t.skip(`${PROMTOOL} not installed; CI installs Debian's prometheus package`)
    else t.ok(promtoolRuns >= NUM_RUNS / PROMTOOL_EVERY, `promtool check metrics accepted ${promtoolRuns} of the expositions`)
  })
}

t.test('the strict parser itself rejects what it must (else the property above proves nothing)', async (t) => {
  const good = '# HELP a_b x \\\\ y\n# TYPE a_b gauge\na_b{l="v\\"\\n\\\\"} 1\n'
  t.doesNotThrow(() => parseExposition(good), 'a well-formed body parses')
  const bad = [
    ['no final newline', good.slice(0, -1)],
    ['an empty line', good + '\n'],
    ['a free comment', '# hello\n'],
    ['a bad escape in a label value', '# TYPE a gauge\na{l="\\x"} 1\n'],
    ['a raw quote in a label value', '# TYPE a gauge\na{l="a"b"} 1\n'],
    ['a bad metric name', '# TYPE 1a gauge\n1a 1\n'],
    ['a bad label name', '# TYPE a gauge\na{1l="v"} 1\n'],
    ['a reserved label name', '# TYPE a gauge\na{__l="v"} 1\n'],
    ['a label twice', '# TYPE a gauge\na{l="v",l="w"} 1\n'],
    ['a duplicate series', '# TYPE a gauge\na{l="v"} 1\na{l="v"} 2\n'],
    ['a duplicate series, labels reordered', '# TYPE a gauge\na{k="1",l="v"} 1\na{l="v",k="1"} 2\n'],
    ['a bad value', '# TYPE a gauge\na 1x\n'],
    ['Inf without a sign', '# TYPE a gauge\na Inf\n'],
    ['two spaces', '# TYPE a gauge\na  1\n'],
    ['an unknown type', '# TYPE a meter\na 1\n'],
    ['TYPE after samples', '# TYPE a gauge\na 1\n# HELP a late\n'],
    ['a family in two places', '# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na 2\n'],
    ['a bad escape in HELP', '# HELP a x \\" y\n'],
    ['an unterminated label value', '# TYPE a gauge\na{l="v} 1\n'],
  ]
  for (const [what, body] of bad) t.throws(() => parseExposition(body), `${what} is rejected`)
  t.equal(sanitize('a\ud800b\u{1F600}c-_'), 'a_b_c-_', 'the test\'s sanitize: a lone surrogate and an emoji are one `_` each')
})
