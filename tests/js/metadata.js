// Usage: node metadata.js HOST:PORT [TOPIC...]
// Connects a kafkajs admin client, prints one JSON line:
//   {"cluster": <describeCluster()>, "topics": <fetchTopicMetadata({topics})>}
// Exit code 1 (and the error on stderr) on any failure; every wait is bounded.
const { Kafka, logLevel } = require("kafkajs");

async function main() {
  const [bootstrap, ...topics] = process.argv.slice(2);
  if (!bootstrap) throw new Error("usage: node metadata.js HOST:PORT [TOPIC...]");
  const kafka = new Kafka({
    clientId: "rallypoint-metadata-test",
    brokers: [bootstrap],
    logLevel: logLevel.NOTHING,
    connectionTimeout: 5000,
    requestTimeout: 10000,
    retry: { retries: 2 },
  });
  const admin = kafka.admin();
  await admin.connect();
  try {
    const cluster = await admin.describeCluster();
    const metadata = await admin.fetchTopicMetadata({ topics });
    process.stdout.write(JSON.stringify({ cluster, topics: metadata.topics }) + "\n");
  } finally {
    await admin.disconnect();
  }
}

const timer = setTimeout(() => {
  process.stderr.write("timed out\n");
  process.exit(2);
}, 30000);
main()
  .then(() => {
    clearTimeout(timer);
    process.exit(0);
  })
  .catch((err) => {
    process.stderr.write(String(err && err.stack ? err.stack : err) + "\n");
    process.exit(1);
  });
