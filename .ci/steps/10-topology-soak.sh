#!/usr/bin/env bash
# Topology churn with worker threads (test/topology-soak.js): 200,000 topic create/remove cycles,
# each with a group removed, while 3 workers record on the live topics; on each backend. Every
# surviving counter must equal what the threads recorded, no fault may be raised, and memory (RSS
# beyond the arena's chunks included, by quarter medians), the registration log and the slots
# reserved must stay bounded by what is alive. One TAP point per backend.
set -u
cd "$(dirname "$0")/../.."
backends="js"
[ -f build/Release/mq_metrics.node ] && backends="js native"
tap=$(mktemp)
n=0
status=0
echo "TAP version 14" > "$tap"
for backend in $backends; do
  n=$((n + 1))
  if out=$(timeout 600 node --expose-gc test/topology-soak.js --cycles 200000 --backend "$backend" 2>&1); then
    echo "ok $n - topology soak, $backend" >> "$tap"
  else
    status=1
    echo "not ok $n - topology soak, $backend" >> "$tap"
  fi
  printf '%s\n' "$out" | sed 's/^/# /' >> "$tap"
done
echo "1..$n" >> "$tap"
cat "$tap"
[ -n "${CI_TAP_OUT:-}" ] && cp "$tap" "$CI_TAP_OUT"
rm -f "$tap"
exit $status
