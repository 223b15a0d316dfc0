"""Listeners, SASL and TLS (docs/security.md).

``listeners`` parses Kafka's listener settings; ``sasl`` is the per-connection authenticator
(a sans-IO state machine the server feeds frames); ``scram`` and ``credentials`` keep SCRAM
credentials as Kafka does (salted); ``tls`` builds the listeners' ``ssl`` contexts; ``certs``
writes a throwaway CA and broker certificate for tests.
"""
