'use strict'
// aedes with mq-metrics: MQTT on 1883 (MQTT_PORT), /metrics, /healthz and /stats on 9464 (METRICS_PORT).
const net = require('node:net')
const aedes = require('aedes')
const { createSurface } = require('mq-metrics')
const { instrument } = require('./instrument')

async function start({ mqttPort = 1883, metricsPort = 9464, host = '127.0.0.1', config, glue: options, aedes: aedesOptions } = {}) {
  const broker = aedes(aedesOptions)
  const surface = createSurface(config) // mq-metrics' configuration (limits: max_topics, …)
  const glue = instrument(broker, surface, options) // options: { window } (instrument.js)
  const server = net.createServer(broker.handle)
  await new Promise((resolve) => server.listen(mqttPort, host, resolve))
  const metrics = await surface.listen({ port: metricsPort, host })
  const close = async () => {
    await new Promise((resolve) => broker.close(resolve))
    await new Promise((resolve) => server.close(resolve))
    await surface.close()
  }
  return { broker, surface, glue, mqttPort: server.address().port, metricsUrl: metrics.url, close }
}

module.exports = { start }

if (require.main === module) {
  start({ mqttPort: Number(process.env.MQTT_PORT ?? 1883), metricsPort: Number(process.env.METRICS_PORT ?? 9464) }).then((b) => {
    console.log(`MQTT on 127.0.0.1:${b.mqttPort}; metrics on ${b.metricsUrl}/metrics (backend ${b.surface.backend})`)
  })
}
