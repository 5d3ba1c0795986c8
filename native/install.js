'use strict'
// `npm install` hook: build the native core with node-gyp. A failed build is not an install
// failure: the TypeScript backend takes over (design §1), and we say so in exactly one line.
const { spawnSync } = require('node:child_process')
const path = require('node:path')

const root = path.join(__dirname, '..')
let nodeGyp
try {
  nodeGyp = require.resolve('node-gyp/bin/node-gyp.js', { paths: [root] })
} catch {
  // npm bundles node-gyp; npm_config_node_gyp points at it during lifecycle scripts.
  nodeGyp = process.env.npm_config_node_gyp
}
// Build against the headers of the Node.js that runs us when they are installed beside it, so
// that no header download is needed (this machine has no internet beyond the package registries).
const fs = require('node:fs')
const args = [nodeGyp, 'rebuild']
const prefix = path.join(path.dirname(process.execPath), '..')
if (!process.env.npm_config_nodedir && fs.existsSync(path.join(prefix, 'include', 'node', 'node_api.h'))) {
  args.push(`--nodedir=${prefix}`)
}
const result = nodeGyp
  ? spawnSync(process.execPath, args, { cwd: root, encoding: 'utf8' })
  : { status: 1, stderr: 'node-gyp not found' }

if (result.status === 0) {
  console.log('mq-metrics: native core built (build/Release/mq_metrics.node)')
} else {
  const reason = String(result.stderr || result.error || '').split('\n').find((l) => /error/i.test(l)) || 'build failed'
  console.warn(`mq-metrics: WARNING native core not built (${reason.trim().slice(0, 160)}); using the TypeScript backend`)
}
