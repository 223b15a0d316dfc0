"""Share groups (KIP-932): membership, share sessions, record states and their durable state
(docs/share-groups.md)."""
