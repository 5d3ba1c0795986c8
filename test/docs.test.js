'use strict'
// Every code example in README.md and docs/*.md runs as written. js and ts blocks run (sh, yaml,
// json and text blocks are illustrations). A block whose first line is `// file: NAME` is saved as
// NAME for the blocks after it in the same document (a worker's file). ts is transpiled by
// TypeScript (types stripped, nothing checked); a block with `import` runs as an ES module, so
// top-level await works. Each document's blocks run in a temporary project in which
// `mq-metrics` is this repository, and must exit 0 without writing an error. A line that prints
// with `console.log(…) // what it prints`, or with that comment alone on the next line, must run
// and print that: the comment is the output as console.log writes it (or as util.inspect shows
// each value: 'native'; runs of white space, line breaks included, compare as one space), whole or
// followed by ', ', ': ', ' (', '…' or ' —' and words about it. A comment starting `e.g.` is not
// checked (an output that depends on the machine).
const t = require('tap')
const { promtoolFor, withoutBackendWarning } = require('./helpers') // children spawned here start without tap's hooks (see helpers.js)
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { spawnSync } = require('node:child_process')
const ts = require('typescript')

const root = path.join(__dirname, '..')
const documents = ['README.md', ...fs.readdirSync(path.join(root, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => `docs/${f}`)]
const project = fs.mkdtempSync(path.join(os.tmpdir(), 'mq-docs-'))
fs.mkdirSync(path.join(project, 'node_modules'))
fs.symlinkSync(root, path.join(project, 'node_modules', 'mq-metrics'), 'dir')
t.teardown(() => fs.rmSync(project, { recursive: true, force: true }))
// Every fault an example raises is written to its stderr: an example that does not listen for
// faults (it would show them itself) must raise none, or it teaches a misuse.
const preload = path.join(project, 'faults-shown.js')
fs.writeFileSync(preload, `
const { Surface } = require(${JSON.stringify(path.join(root, 'dist', 'surface.js'))})
const emit = Surface.prototype.emit
Surface.prototype.emit = function (event, ...args) {
  if (event === 'fault') process.stderr.write('FAULT ' + args[0].code + ' ' + JSON.stringify(args[0].labels) + '\\n')
  return emit.call(this, event, ...args)
}
`)

// The output of each checked line (see instrument()), one JSON line per call, in a file the test names.
fs.appendFileSync(preload, `
const util = require('node:util')
globalThis.__docLog = (line, ...args) => {
  require('node:fs').appendFileSync(process.env.DOCS_OUTPUT, JSON.stringify({ line, format: util.format(...args), inspect: args.map((a) => util.inspect(a)).join(' ') }) + '\\n')
  console.log(...args)
}
`)

/** The block with each checked console.log line calling __docLog(its line, …) instead; and what each must print. */
function instrument(code) {
  const expected = []
  const source = code.split('\n')
  const lines = source.map((text, i) => {
    const m = /^(\s*)console\.log\((.*\))\s+\/\/ (.+)$/.exec(text) ?? commentBelow(text, source[i + 1])
    if (!m || m[3].startsWith('e.g.')) return text
    expected.push({ line: i + 1, comment: m[3].trim() })
    return `${m[1]}__docLog(${i + 1}, ${m[2]}`
  })
  return { code: lines.join('\n'), expected }
}

/** A console.log line whose output is the comment alone on the next line (too long for one): [, indent, arguments, comment]. */
function commentBelow(text, next = '') {
  const log = /^(\s*)console\.log\((.*\))\s*$/.exec(text)
  const comment = /^\s*\/\/ (.+)$/.exec(next)
  return log && comment ? [log[0], log[1], log[2], comment[1]] : undefined
}

/** Whether `comment` says what the call printed: whole, or followed by words about it. */
function says(comment, printed) {
  const flat = (text) => text.replace(/\s+/g, ' ')
  comment = flat(comment)
  return [printed.format, printed.inspect].map(flat).some((out) => comment === out || (comment.startsWith(out) && /^(, |: | \(|…| —)/.test(comment.slice(out.length))))
}

function blocks(text) {
  const found = []
  const fence = /^```(js|ts|javascript|typescript)\n([\s\S]*?)^```$/gm
  for (let m; (m = fence.exec(text));) found.push({ lang: m[1][0] === 't' ? 'ts' : 'js', code: m[2], line: text.slice(0, m.index).split('\n').length })
  return found
}

function compile({ lang, code }) {
  const esm = /^\s*(import|export)\s/m.test(code)
  const js = lang === 'ts'
    ? ts.transpileModule(code, { compilerOptions: { module: esm ? ts.ModuleKind.ESNext : ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022 } }).outputText
    : code
  return { js, ext: esm ? '.mjs' : '.js' }
}

let total = 0
let checkedLines = 0
for (const doc of documents) {
  const found = blocks(fs.readFileSync(path.join(root, doc), 'utf8'))
  if (found.length === 0) continue
  t.test(doc, async (t) => {
    const dir = fs.mkdtempSync(path.join(project, doc.replace(/\W/g, '_') + '-'))
    for (const [i, block] of found.entries()) {
      total++
      const { code, expected } = instrument(block.code)
      const { js, ext } = compile({ ...block, code })
      const named = /^\/\/ file: (\S+)/.exec(block.code)
      if (named) {
        fs.writeFileSync(path.join(dir, named[1]), js)
        t.pass(`block ${i + 1} (line ${block.line}) saved as ${named[1]}`)
        continue
      }
      const file = path.join(dir, `example-${i + 1}${ext}`)
      fs.writeFileSync(file, js)
      const output = `${file}.out`
      const env = { ...process.env, DOCS_OUTPUT: output }
      delete env.MQ_METRICS_BACKEND
      const r = spawnSync(process.execPath, ['--require', preload, file], { cwd: dir, encoding: 'utf8', timeout: 30_000, env })
      t.equal(r.status, 0, `${doc} block ${i + 1} (line ${block.line}) runs and exits 0`, { stdout: r.stdout, stderr: r.stderr })
      t.notMatch(withoutBackendWarning(r.stderr), /Error|Warning/, `${doc} block ${i + 1} (line ${block.line}) writes no error`)
      const printed = fs.existsSync(output) ? fs.readFileSync(output, 'utf8').trim().split('\n').map((l) => JSON.parse(l)) : []
      for (const { line, comment } of expected) {
        const at = `${doc} line ${block.line + line}`
        const calls = printed.filter((p) => p.line === line)
        t.ok(calls.length > 0, `${at}: its console.log runs`)
        for (const call of calls) t.ok(says(comment, call), `${at} prints what its comment says`, { comment, printed: call.format, inspected: call.inspect })
      }
      checkedLines += expected.length
      if (!/\.on\('fault'/.test(block.code)) t.notMatch(r.stderr, /^FAULT /m, `${doc} block ${i + 1} (line ${block.line}) raises no fault (it listens for none)`)
    }
  })
}
t.test('there are examples to run', async (t) => {
  t.ok(total >= 8, `${total} blocks`)
  t.ok(checkedLines >= 8, `${checkedLines} printed lines checked against their comments`)
})

// The yaml blocks an operator pastes into Prometheus: a configuration (with the shipped rule
// files beside it, as the docs say to install them) passes `promtool check config`, a rule group
// `promtool check rules`. Other yaml (Alertmanager's inhibit_rules) is an illustration.
t.test('every Prometheus configuration and rule group in the docs passes promtool', async (t) => {
  const promtool = promtoolFor(t)
  if (!promtool) return
  const dir = fs.mkdtempSync(path.join(project, 'yaml-'))
  for (const file of ['mq-alerts.yml', 'mq-cluster.rules.yml']) fs.copyFileSync(path.join(root, 'prometheus', file), path.join(dir, file))
  let checked = 0
  for (const doc of documents) {
    const text = fs.readFileSync(path.join(root, doc), 'utf8')
    const fence = /^```yaml\n([\s\S]*?)^```$/gm
    for (let m; (m = fence.exec(text));) {
      const line = text.slice(0, m.index).split('\n').length
      const kind = /^groups:/m.test(m[1]) ? 'rules' : /^(global|scrape_configs|rule_files):/m.test(m[1]) ? 'config' : undefined
      if (kind === undefined) continue
      const file = path.join(dir, `${doc.replace(/\W/g, '_')}-${line}.yml`)
      fs.writeFileSync(file, m[1])
      const r = spawnSync(promtool, ['check', kind, file], { cwd: dir, encoding: 'utf8', timeout: 30_000 })
      t.equal(r.status, 0, `${doc} line ${line}: promtool check ${kind}`, { stdout: r.stdout, stderr: r.stderr })
      checked++
    }
  }
  t.ok(checked >= 5, `${checked} blocks checked`)
})

t.test('every relative link in README.md, CHANGELOG.md, docs/ and the aedes example resolves in the repository', (t) => {
  // The installed package's are checked by CI's package step (.ci/steps/60-package-install.sh).
  const { brokenLinks } = require('../scripts/check-links')
  t.same(brokenLinks(root), [], 'no broken link')
  const scratch = fs.mkdtempSync(path.join(project, 'links-'))
  fs.mkdirSync(path.join(scratch, 'docs'))
  fs.writeFileSync(path.join(scratch, 'README.md'), 'See [the guide](docs/guide.md#start), [gone](docs/gone.md), [a site](https://example.com/x.md), `[code](nowhere.md)` and [here](#top).\n')
  fs.writeFileSync(path.join(scratch, 'docs', 'guide.md'), '[back](../README.md) [missing](../examples/demo/)\n')
  t.same(brokenLinks(scratch), ['README.md: docs/gone.md', 'docs/guide.md: ../examples/demo/'], 'the check finds a broken link, and only those')
  t.end()
})

t.test('docs/faults.md gives the fault ring slot\'s size as the code has it', (t) => {
  const { MAX_TEXT } = require('../dist/core/worker-faults')
  t.match(fs.readFileSync(path.join(root, 'docs', 'faults.md'), 'utf8'), new RegExp(`ring slot of ${MAX_TEXT} characters`))
  t.end()
})
