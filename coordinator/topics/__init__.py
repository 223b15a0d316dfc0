"""The in-memory topic data plane."""

from .errors import TopicError
from .store import Topic, TopicStore

__all__ = ["Topic", "TopicError", "TopicStore"]
