"""Crash safety suites: kill -9 during a commit storm of real clients, torn writes, full disks.

See docs/reliability.md, "Crash safety".
"""
