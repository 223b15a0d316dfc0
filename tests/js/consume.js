// Read a topic back with a kafkajs consumer group (kafkajs has no assign mode), then print JSON.
// usage: node consume.js <broker host:port> <topic> <group> <N> <timeout ms>
// Joins a fresh GROUP subscribed to TOPIC from the beginning, collects messages until it has N,
// leaves the group (disconnect) and prints one JSON document:
//   {"messages": [{"partition": p, "offset": o, "key": base64|null, "value": base64|null,
//                  "headers": [[name, base64|null], ...]}, ...]}
// Exits 2 with a message on stderr if N messages have not arrived within the timeout.
const { Kafka, logLevel } = require('kafkajs')

const b64 = buf => (buf === null || buf === undefined ? null : Buffer.from(buf).toString('base64'))

async function main() {
  const [broker, topic, groupId, nArg, timeoutArg] = process.argv.slice(2)
  const n = Number(nArg)
  const timeoutMs = Number(timeoutArg)
  const kafka = new Kafka({ clientId: 'rallypoint-kafkajs', brokers: [broker], logLevel: logLevel.ERROR })
  const consumer = kafka.consumer({ groupId, sessionTimeout: 10000, heartbeatInterval: 1000 })
  const messages = []
  let done
  const enough = new Promise(resolve => (done = resolve))
  const timer = setTimeout(() => {
    console.error(`timeout: ${messages.length} of ${n} messages from ${topic} after ${timeoutMs} ms`)
    process.exit(2)
  }, timeoutMs)
  consumer.on(consumer.events.CRASH, ({ payload }) => {
    console.error(`consumer crashed: ${payload.error}`)
    process.exit(1)
  })
  await consumer.connect()
  await consumer.subscribe({ topics: [topic], fromBeginning: true })
  await consumer.run({
    eachBatch: async ({ batch }) => {
      for (const m of batch.messages) {
        const headers = []
        // kafkajs folds repeated header names into an array of values.
        for (const [name, v] of Object.entries(m.headers || {})) {
          for (const one of Array.isArray(v) ? v : [v]) headers.push([name, b64(one)])
        }
        messages.push({ partition: batch.partition, offset: Number(m.offset), key: b64(m.key), value: b64(m.value), headers })
      }
      if (messages.length >= n) done()
    },
  })
  await enough
  await consumer.disconnect()
  clearTimeout(timer)
  process.stdout.write(JSON.stringify({ messages }) + '\n')
}

main().catch(e => {
  console.error(e)
  process.exit(1)
})
