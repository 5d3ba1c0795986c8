#!/usr/bin/env node
'use strict'
// Every relative link in the Markdown files a reader opens (README.md, docs/, the shipped example's
// README) names a file or folder that exists under DIR: the repository, or the installed package.
//   node scripts/check-links.js [DIR]   → one line per broken link; exit status 1 if any
const fs = require('node:fs')
const path = require('node:path')

/** The broken relative links of the Markdown files under `root`: `file: target`. */
function brokenLinks(root) {
  const files = ['README.md', 'CHANGELOG.md', 'examples/aedes/README.md']
  const docs = path.join(root, 'docs')
  if (fs.existsSync(docs)) for (const name of fs.readdirSync(docs)) if (name.endsWith('.md')) files.push(`docs/${name}`)
  const broken = []
  for (const file of files) {
    const full = path.join(root, file)
    if (!fs.existsSync(full)) continue
    // Inline links and images, outside code spans and fences.
    const text = fs.readFileSync(full, 'utf8').replace(/```[\s\S]*?```/g, '').replace(/`[^`\n]*`/g, '')
    for (const match of text.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
      const target = match[1]
      if (/^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith('#')) continue // a URL, an anchor here
      const local = decodeURIComponent(target.split('#')[0])
      if (!fs.existsSync(path.resolve(path.dirname(full), local))) broken.push(`${file}: ${target}`)
    }
  }
  return broken
}

module.exports = { brokenLinks }

if (require.main === module) {
  const broken = brokenLinks(path.resolve(process.argv[2] ?? '.'))
  for (const line of broken) console.log(line)
  process.exit(broken.length > 0 ? 1 : 0)
}
