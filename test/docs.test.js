'use strict'
// Every code example in README.md and docs/*.md runs as written. js and ts blocks run (sh, yaml,
// json and text blocks are illustrations). A block whose first line is `// file: NAME` is saved as
// NAME for the blocks after it in the same document (a worker's file). ts is transpiled by
// TypeScript (types stripped, nothing checked); a block with `import` runs as an ES module, so
// top-level await works. Each document's blocks run in a temporary project in which
// `mq-metrics` is this repository, and must exit 0 without writing an error.
const t = require('tap')
const { promtoolFor } = require('./helpers') // children spawned here start without tap's hooks (see helpers.js)
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
for (const doc of documents) {
  const found = blocks(fs.readFileSync(path.join(root, doc), 'utf8'))
  if (found.length === 0) continue
  t.test(doc, async (t) => {
    const dir = fs.mkdtempSync(path.join(project, doc.replace(/\W/g, '_') + '-'))
    for (const [i, block] of found.entries()) {
      total++
      const { js, ext } = compile(block)
      const named = /^\/\/ file: (\S+)/.exec(block.code)
      if (named) {
        fs.writeFileSync(path.join(dir, named[1]), js)
        t.pass(`block ${i + 1} (line ${block.line}) saved as ${named[1]}`)
        continue
      }
      const file = path.join(dir, `example-${i + 1}${ext}`)
      fs.writeFileSync(file, js)
      const env = { ...process.env }
      delete env.MQ_METRICS_BACKEND
      const r = spawnSync(process.execPath, ['--require', preload, file], { cwd: dir, encoding: 'utf8', timeout: 30_000, env })
      t.equal(r.status, 0, `${doc} block ${i + 1} (line ${block.line}) runs and exits 0`, { stdout: r.stdout, stderr: r.stderr })
      t.notMatch(r.stderr, /Error|Warning/, `${doc} block ${i + 1} (line ${block.line}) writes no error`)
      if (!/\.on\('fault'/.test(block.code)) t.notMatch(r.stderr, /^FAULT /m, `${doc} block ${i + 1} (line ${block.line}) raises no fault (it listens for none)`)
    }
  })
}
t.test('there are examples to run', async (t) => t.ok(total >= 8, `${total} blocks`))

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
