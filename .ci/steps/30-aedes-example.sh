#!/usr/bin/env bash
# examples/aedes: a real MQTT broker (aedes) instrumented with mq-metrics, driven by mqtt.js over
# loopback, with a real Prometheus ingesting /metrics. Its own dependencies, installed here.
set -u
cd "$(dirname "$0")/../../examples/aedes"
npm ci --no-audit --no-fund < /dev/null || exit 1
timeout 300 node --test --test-reporter=tap test.js > "${CI_TAP_OUT:-/dev/stdout}"
