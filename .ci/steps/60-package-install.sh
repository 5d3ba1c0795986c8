#!/usr/bin/env bash
# The package as a user installs it (docs/install.md): `npm pack`, then the tarball into an empty
# project, three ways, each followed by a recording round trip (main thread and a worker):
#   a. no C++ compiler and no make on PATH  → the prebuilt binary, backend native
#   b. the prebuilt binary removed, compiler present → built from source, backend native
#   c. neither → the TypeScript backend, one warning line, everything works
#   d. then docs/install.md's fix, `npm rebuild mq-metrics` with a compiler → native
#   e. install scripts skipped (`--ignore-scripts`, as npm 12 does for a package not approved) and
#      no compiler → the prebuilt binary, backend native: it needs no script
# Writes TAP to $CI_TAP_OUT.
set -u
cd "$(dirname "$0")/../.."
out="${CI_TAP_OUT:-/dev/stdout}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
n=0
: > "$out"
point () { # point OK DESCRIPTION [DIAGNOSTIC FILE]
  n=$((n + 1))
  if [ "$1" = ok ]; then echo "ok $n - $2" >> "$out"; else
    echo "not ok $n - $2" >> "$out"
    [ -n "${3:-}" ] && [ -f "$3" ] && tail -n 30 "$3" | sed 's/^/  # /' >> "$out"
  fi
}

# --- the tarballs --------------------------------------------------------------------------------
# A maintainer's dist/ may have lost a file (an incremental tsc never writes it again) or kept one
# whose source is gone: the pack builds dist/ anew, so neither reaches the tarball.
rm -f dist/surface.js && echo "module.exports = 'stale'" > dist/stale-leftover.js
npm pack --pack-destination "$work" > "$work/pack.log" 2>&1
tarball=$(ls "$work"/mq-metrics-*.tgz 2>/dev/null | head -n 1)
if [ -z "$tarball" ]; then point fail "npm pack" "$work/pack.log"; echo "1..$n" >> "$out"; exit 1; fi
if tar tzf "$tarball" | grep -qx "package/dist/surface.js" && ! tar tzf "$tarball" | grep -q "stale-leftover"; then
  point ok "npm pack builds dist/ anew: a file missing from dist/ is shipped, a stale one is not"
else
  point fail "npm pack builds dist/ anew: a file missing from dist/ is shipped, a stale one is not" "$work/pack.log"
fi
platform=$(node -p 'process.platform + "-" + process.arch')
if tar tzf "$tarball" | grep -qx "package/prebuilds/$platform/mq_metrics.node"; then
  point ok "npm pack ships prebuilds/$platform/mq_metrics.node"
else
  point fail "npm pack ships prebuilds/$platform/mq_metrics.node" "$work/pack.log"
fi
if tar tzf "$tarball" | grep -q '^package/build/'; then point fail "no build/ directory in the tarball"; else point ok "no build/ directory in the tarball"; fi
# The shipped binary loads wherever the official Node.js binaries run (docs/native.md): it may need
# no newer C library, C++ library or C++ ABI symbol version than Node.js 22's own binary does
# (GLIBC 2.28, GLIBCXX 3.4.21, CXXABI 1.3.9), or a distribution such as Debian 11 or RHEL 8 would
# fall back to the TypeScript backend though Node runs there.
if [ "$(uname -s)" = Linux ]; then
  mkdir -p "$work/shipped" && tar xzf "$tarball" -C "$work/shipped" "package/prebuilds/$platform/mq_metrics.node" 2> /dev/null
  objdump -T "$work/shipped/package/prebuilds/$platform/mq_metrics.node" > "$work/symbols.txt" 2>&1
  newest () { grep -o "($1_[0-9.]*)" "$work/symbols.txt" | tr -d '()' | sed "s/^$1_//" | sort -V | tail -n 1; }
  within () { [ -z "$2" ] || [ "$(printf '%s\n%s\n' "$2" "$3" | sort -V | tail -n 1)" = "$3" ]; }
  glibc=$(newest GLIBC) glibcxx=$(newest GLIBCXX) cxxabi=$(newest CXXABI)
  if [ -n "$glibc" ] && within GLIBC "$glibc" 2.28 && within GLIBCXX "$glibcxx" 3.4.21 && within CXXABI "$cxxabi" 1.3.9; then
    point ok "the shipped binary needs GLIBC ${glibc}, GLIBCXX ${glibcxx:-none}, CXXABI ${cxxabi:-none}: no newer than Node.js 22 itself"
  else
    point fail "the shipped binary needs GLIBC ${glibc:-?}, GLIBCXX ${glibcxx:-none}, CXXABI ${cxxabi:-none}: newer than Node.js 22 itself (2.28, 3.4.21, 1.3.9)" "$work/symbols.txt"
  fi
fi
mkdir -p "$work/strip" && tar xzf "$tarball" -C "$work/strip" && rm -rf "$work/strip/package/prebuilds"
stripped="$work/mq-metrics-without-prebuilds.tgz"
tar czf "$stripped" -C "$work/strip" package

# --- a PATH without a compiler: only what npm and node-gyp's first steps use ---------------------
nocc="$work/nocc-bin"
mkdir -p "$nocc"
for tool in node npm npx sh bash env python3 tar gzip cat cp mv rm mkdir ls uname grep sed dirname basename readlink; do
  found=$(command -v "$tool") && ln -s "$found" "$nocc/$tool"
done
if PATH="$nocc" command -v g++ > /dev/null || PATH="$nocc" command -v make > /dev/null || PATH="$nocc" command -v cc > /dev/null; then
  point fail "the reduced PATH has no compiler and no make"
else
  point ok "the reduced PATH has no compiler and no make"
fi

check='
const { createSurface } = require("mq-metrics")
const { Worker } = require("node:worker_threads")
const s = createSurface()
const topic = s.topic("orders")
const g = topic.group("billing")
const seq = topic.append(0, 100)
g.send(0, seq)
const w = new Worker(`const { workerData } = require("node:worker_threads"); const r = require("mq-metrics").attachSurface(workerData);
  const t = r.topic("orders"); t.group("billing").settle(0, 1, "delivered"); t.append(0, 50)`, { eval: true, workerData: s.share() })
w.on("exit", (code) => {
  const totals = s.stats("topics").totals
  const text = s.render()
  console.log(JSON.stringify({ backend: s.backend, reason: s.backendReason, worker: code, produced: totals.produced, delivered: totals.delivered,
    rendered: text.includes("mq_partition_last_seq{topic=\"orders\",partition=\"0\"} 2"),
    rules: require("node:fs").existsSync(require.resolve("mq-metrics/prometheus/mq-alerts.yml")) && require("node:fs").existsSync(require.resolve("mq-metrics/grafana/mq-cluster.json")) }))
  s.close()
})'

scenario () { # scenario NAME TARBALL PATH EXPECTED-BACKEND WARNINGS [NPM-FLAG]
  local name=$1 tgz=$2 path=$3 backend=$4 warnings=$5 flag=${6:---foreground-scripts} dir="$work/$1"
  mkdir -p "$dir"
  echo '{ "name": "user-project", "version": "1.0.0", "private": true }' > "$dir/package.json"
  if ! (cd "$dir" && PATH="$path" npm install --no-audit --no-fund "$flag" "$tgz" > install.log 2>&1); then
    point fail "$name: npm install of the tarball" "$dir/install.log"; return
  fi
  point ok "$name: npm install of the tarball"
  (cd "$dir" && PATH="$path" node -e "$check" > check.out 2> check.err)
  local got
  got=$(cat "$dir/check.out")
  cat "$dir/install.log" "$dir/check.err" > "$dir/diag.log"
  echo "check: $got" >> "$dir/diag.log"
  if node -e 'const r = JSON.parse(process.argv[1]); process.exit(r.backend === process.argv[2] ? 0 : 1)' "$got" "$backend" 2> /dev/null; then
    point ok "$name: backend $backend ($(node -p 'JSON.parse(process.argv[1]).reason' "$got"))"
  else
    point fail "$name: backend $backend" "$dir/diag.log"
  fi
  if node -e 'const r = JSON.parse(process.argv[1]); process.exit(r.worker === 0 && r.produced === 2 && r.delivered === 1 && r.rendered ? 0 : 1)' "$got" 2> /dev/null; then
    point ok "$name: a round trip from the main thread and a worker (produced 2, delivered 1, rendered)"
  else
    point fail "$name: a round trip from the main thread and a worker" "$dir/diag.log"
  fi
  if node -e 'process.exit(JSON.parse(process.argv[1]).rules === true ? 0 : 1)' "$got" 2> /dev/null; then
    point ok "$name: require.resolve() finds the shipped rules and dashboard (mq-metrics/prometheus/*, mq-metrics/grafana/*)"
  else
    point fail "$name: require.resolve() finds the shipped rules and dashboard" "$dir/diag.log"
  fi
  local seen
  seen=$(grep -c 'MQ_METRICS_NO_NATIVE_CORE' "$dir/check.err")
  if [ "$seen" -eq "$warnings" ]; then point ok "$name: $warnings warning line(s) at first use"; else point fail "$name: $warnings warning line(s) at first use, saw $seen" "$dir/diag.log"; fi
}

scenario "a. no compiler" "$tarball" "$nocc" native 0
# The README and docs as an installed package holds them: every relative link resolves there.
if node scripts/check-links.js "$work/a. no compiler/node_modules/mq-metrics" > "$work/links.log" 2>&1; then
  point ok "a: every relative link in the installed package's README.md, CHANGELOG.md and docs/ resolves in it"
else
  point fail "a: a relative link in the installed package's README.md, CHANGELOG.md or docs/ does not resolve in it" "$work/links.log"
fi
scenario "b. no prebuilt binary, a compiler" "$stripped" "$PATH" native 0
if grep -q 'native core built from source' "$work/b. no prebuilt binary, a compiler/install.log"; then
  point ok "b: the install script built the addon from source in the user's project"
else
  point fail "b: the install script built the addon from source in the user's project" "$work/b. no prebuilt binary, a compiler/install.log"
fi
scenario "c. neither" "$stripped" "$nocc" js 1
# docs/install.md: the install log names the tools the build from source missed.
if grep -q 'build from source failed: .*make.*g++.* not found on PATH' "$work/c. neither/install.log"; then
  point ok "c: the install log names the tools missing from PATH ($(grep -o '[a-z0-9+, ]* not found on PATH' "$work/c. neither/install.log" | head -n 1))"
else
  point fail "c: the install log names the tools missing from PATH" "$work/c. neither/install.log"
fi

# docs/install.md: with npm's default (quiet) output the warning above is hidden; backendReason says why.
if grep -q 'the build at install failed: .*not found on PATH' "$work/c. neither/check.out"; then
  point ok "c: surface.backendReason says why the build at install failed"
else
  point fail "c: surface.backendReason says why the build at install failed" "$work/c. neither/diag.log"
fi

# docs/install.md's troubleshooting, as written: with a compiler now present, `npm rebuild
# mq-metrics` in the project that got the TypeScript backend builds the native core.
dir="$work/c. neither"
if (cd "$dir" && npm rebuild mq-metrics --foreground-scripts > rebuild.log 2>&1) &&
   (cd "$dir" && node -e "$check" > rebuilt.out 2> rebuilt.err) &&
   node -e 'const r = JSON.parse(process.argv[1]); process.exit(r.backend === "native" && r.produced === 2 ? 0 : 1)' "$(cat "$dir/rebuilt.out")"; then
  point ok "d. the troubleshooting command (npm rebuild mq-metrics, a compiler present) gives the native backend"
else
  cat "$dir/rebuild.log" "$dir/rebuilt.err" "$dir/rebuilt.out" > "$dir/rebuild-diag.log" 2> /dev/null
  point fail "d. the troubleshooting command (npm rebuild mq-metrics, a compiler present) gives the native backend" "$dir/rebuild-diag.log"
fi

scenario "e. install scripts skipped" "$tarball" "$nocc" native 0 --ignore-scripts

echo "1..$n" >> "$out"
! grep -q '^not ok' "$out"
