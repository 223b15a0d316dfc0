"""The in-memory topic data plane."""

from .store import Topic, TopicError, TopicStore

__all__ = ["Topic", "TopicError", "TopicStore"]
