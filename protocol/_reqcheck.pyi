# Types of the compiled request shape check (protocol/_reqcheck.pyx), for mypy.

OPS: dict[str, int]

def check(program: bytes, buf: bytes | memoryview, pos: int, limit: int) -> int: ...
