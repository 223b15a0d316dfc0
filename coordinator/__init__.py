"""rallypoint: a Kafka-compatible test broker with a faithful consumer-group coordinator."""

__version__ = "0.1.0"
