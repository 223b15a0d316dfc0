// A kafkajs consumer-group member for tests/test_groups_clients.py.
//
//   node group_member.js BOOTSTRAP GROUP TOPICS EVENTS_FILE STOP_FILE [MAX_SECONDS]
//
// Joins GROUP subscribed to TOPICS (comma separated) with a round-robin assigner registered
// under the protocol name "roundrobin" (the name every other client uses; kafkajs calls its own
// "RoundRobinAssigner"), appends one JSON line per event to EVENTS_FILE, and leaves the group
// (disconnect) when STOP_FILE exists or after MAX_SECONDS.
const fs = require('fs')
const { Kafka, logLevel, PartitionAssigners, AssignerProtocol } = require('kafkajs')

const [bootstrap, groupId, topics, eventsFile, stopFile, maxSeconds = '120'] = process.argv.slice(2)

const emit = (event, fields = {}) =>
  fs.appendFileSync(eventsFile, JSON.stringify({ event, t: Date.now() / 1000, ...fields }) + '\n')

const namedRoundRobin = ({ cluster }) => {
  const rr = PartitionAssigners.roundRobin({ cluster })
  return {
    ...rr,
    name: 'roundrobin',
    protocol({ topics }) {
      return { name: 'roundrobin', metadata: AssignerProtocol.MemberMetadata.encode({ version: 0, topics }) }
    },
  }
}

const main = async () => {
  const kafka = new Kafka({ clientId: 'kafkajs-member', brokers: [bootstrap], logLevel: logLevel.ERROR })
  const consumer = kafka.consumer({
    groupId,
    sessionTimeout: 6000,
    heartbeatInterval: 1000,
    rebalanceTimeout: 30000,
    partitionAssigners: [namedRoundRobin],
  })
  consumer.on(consumer.events.GROUP_JOIN, ({ payload }) => {
    const partitions = []
    for (const [topic, ps] of Object.entries(payload.memberAssignment)) {
      for (const p of ps) partitions.push([topic, p])
    }
    partitions.sort()
    emit('assignment', {
      partitions,
      member_id: payload.memberId,
      protocol: payload.groupProtocol,
      is_leader: payload.isLeader,
    })
  })
  consumer.on(consumer.events.CRASH, ({ payload }) => emit('crash', { error: String(payload.error) }))
  await consumer.connect()
  await consumer.subscribe({ topics: topics.split(','), fromBeginning: true })
  await consumer.run({ eachMessage: async () => {} })
  emit('started')
  const deadline = Date.now() + Number(maxSeconds) * 1000
  while (!fs.existsSync(stopFile) && Date.now() < deadline) {
    await new Promise(resolve => setTimeout(resolve, 100))
  }
  await consumer.disconnect()
  emit('closed')
}

main().then(
  () => process.exit(0),
  err => {
    emit('failed', { error: String(err) })
    process.exit(1)
  }
)
