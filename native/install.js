'use strict'
// `npm install` hook (docs/install.md). The native core comes, in order, from the prebuilt binary
// in the package for this platform, or from a build from source (node-gyp: npm ships it; the
// addon needs nothing but Node's own headers). Neither is an install failure: the TypeScript
// backend takes over, and the first surface created says why, in one line on stderr.
const { spawnSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const root = path.join(__dirname, '..')
const platform = `${process.platform}-${process.arch}`
const prebuilt = path.join(root, 'prebuilds', platform, 'mq_metrics.node')

function loads(file) {
  const probe = spawnSync(process.execPath, ['-e', `require(${JSON.stringify(file)})`], { encoding: 'utf8' })
  return probe.status === 0 ? '' : (probe.stderr.split('\n').find((line) => /Error/.test(line)) || 'does not load').trim()
}

function build() {
  let nodeGyp = process.env.npm_config_node_gyp // npm's own node-gyp, during lifecycle scripts
  if (!nodeGyp) {
    try {
      nodeGyp = require.resolve('node-gyp/bin/node-gyp.js', { paths: [root] })
    } catch {
      return 'node-gyp not found'
    }
  }
  const args = [nodeGyp, 'rebuild']
  // Build against the headers of the Node.js that runs us when they are installed beside it, so
  // that no header download is needed.
  const prefix = path.join(path.dirname(process.execPath), '..')
  if (!process.env.npm_config_nodedir && fs.existsSync(path.join(prefix, 'include', 'node', 'node_api.h'))) args.push(`--nodedir=${prefix}`)
  const result = spawnSync(process.execPath, args, { cwd: root, encoding: 'utf8' })
  if (result.status === 0) return ''
  // node-gyp's first error line is a generic one ("gyp ERR! configure error"): the tools it
  // needs that are not on PATH say more, so they come first.
  const missing = [['python3', 'python'], ['make'], [process.env.CXX || 'g++', 'c++', 'clang++']].filter((names) => !names.some(onPath)).map((names) => names[0])
  const output = `${result.stderr || ''}\n${result.stdout || ''}`
  const line = (output.split('\n').find((l) => /not found|error/i.test(l)) || String(result.error || 'build failed')).trim().slice(0, 200)
  return missing.length === 0 ? line : `${missing.join(', ')} not found on PATH; ${line}`
}

/** Whether an executable of that name is on PATH (or the path itself, when it has a slash). */
function onPath(name) {
  const candidates = name.includes('/') ? [name] : (process.env.PATH || '').split(path.delimiter).filter(Boolean).map((dir) => path.join(dir, name))
  return candidates.some((file) => {
    try {
      fs.accessSync(file, fs.constants.X_OK)
      return fs.statSync(file).isFile()
    } catch {
      return false
    }
  })
}

// Why the build failed, kept where the library looks when it runs (lib/core/backend.ts): npm's
// default install output hides the warning below, and surface.backendReason then says it.
const failure = path.join(root, 'build', 'install-failure.txt')
try {
  fs.rmSync(failure, { force: true })
} catch {} // a read-only package directory: nothing can be written there either
if (!process.env.MQ_METRICS_FORCE_BUILD && fs.existsSync(prebuilt) && loads(prebuilt) === '') {
  console.log(`mq-metrics: native core: the prebuilt binary for ${platform}`)
} else {
  const failed = build()
  if (failed === '') console.log('mq-metrics: native core built from source (build/Release/mq_metrics.node)')
  else {
    console.warn(`mq-metrics: WARNING no native core for ${platform} (no prebuilt binary; build from source failed: ${failed}); the TypeScript backend will run`)
    try {
      fs.mkdirSync(path.dirname(failure), { recursive: true })
      fs.writeFileSync(failure, `${failed}\n`)
    } catch {} // a read-only package directory: the warning above is all there is
  }
}
