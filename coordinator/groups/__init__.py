"""Classic consumer groups: the sans-IO state machine and its runtime."""
