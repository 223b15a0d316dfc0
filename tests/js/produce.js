// Produce messages from a JSON file with kafkajs, then print a JSON summary.
// usage: node produce.js <broker host:port> <topic> <messages.json> <none|gzip> [idempotent]
// messages.json: [{"partition": n, "key": base64, "value": base64, "headers": [[name, base64], ...]}, ...]
const fs = require('fs')
const { Kafka, CompressionTypes, logLevel } = require('kafkajs')

async function main() {
  const [broker, topic, file, compression, idempotent] = process.argv.slice(2)
  const raw = JSON.parse(fs.readFileSync(file, 'utf8'))
  const kafka = new Kafka({ clientId: 'rallypoint-kafkajs', brokers: [broker], logLevel: logLevel.ERROR })
  const producer = kafka.producer({ allowAutoTopicCreation: false, idempotent: idempotent === 'idempotent' })
  await producer.connect()
  const messages = raw.map(m => {
    const headers = {}
    for (const [k, v] of m.headers) headers[k] = Buffer.from(v, 'base64')
    return { partition: m.partition, key: Buffer.from(m.key, 'base64'), value: Buffer.from(m.value, 'base64'), headers }
  })
  const codec = compression === 'gzip' ? CompressionTypes.GZIP : CompressionTypes.None
  let acked = 0
  for (let i = 0; i < messages.length; i += 500) {
    const res = await producer.send({ topic, acks: -1, compression: codec, messages: messages.slice(i, i + 500) })
    for (const r of res) if (r.errorCode !== 0) throw new Error(`produce error ${r.errorCode}`)
    acked += Math.min(500, messages.length - i)
  }
  await producer.disconnect()
  console.log(JSON.stringify({ acked }))
}

main().catch(e => { console.error(e); process.exit(1) })
