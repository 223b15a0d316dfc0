// Usage: node sasl.js HOST:PORT MECHANISM USER PASSWORD TOPIC GROUP [CA_FILE]
// kafkajs over SASL (SASL_SSL when CA_FILE is given): produces one message, consumes it as a
// member of GROUP, commits, prints {"value": ...}.  On failure: the error's name and message on
// stderr as JSON, exit code 1; every wait is bounded.
const fs = require("fs");
const { Kafka, logLevel } = require("kafkajs");

async function main() {
  const [bootstrap, mechanism, username, password, topic, groupId, ca] = process.argv.slice(2);
  const kafka = new Kafka({
    clientId: "rallypoint-sasl-test",
    brokers: [bootstrap],
    logLevel: logLevel.NOTHING,
    connectionTimeout: 5000,
    requestTimeout: 10000,
    retry: { retries: 1 },
    sasl: { mechanism: mechanism.toLowerCase(), username, password },
    ssl: ca ? { ca: [fs.readFileSync(ca, "utf-8")] } : false,
  });
  const producer = kafka.producer();
  await producer.connect();
  await producer.send({ topic, messages: [{ value: "kafkajs" }] });
  await producer.disconnect();
  const consumer = kafka.consumer({ groupId });
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  const value = await new Promise((resolve, reject) => {
    consumer
      .run({
        autoCommit: false,
        eachMessage: async ({ topic: t, partition, message }) => {
          await consumer.commitOffsets([{ topic: t, partition, offset: (BigInt(message.offset) + 1n).toString() }]);
          resolve(message.value.toString());
        },
      })
      .catch(reject);
  });
  await consumer.disconnect();
  process.stdout.write(JSON.stringify({ value }) + "\n");
}

const timer = setTimeout(() => {
  process.stderr.write("timed out\n");
  process.exit(2);
}, 45000);
main()
  .then(() => {
    clearTimeout(timer);
    process.exit(0);
  })
  .catch((err) => {
    process.stderr.write(JSON.stringify({ name: err && err.name, message: String(err && err.message) }) + "\n");
    process.exit(1);
  });
