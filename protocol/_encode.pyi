# Types of the compiled response encoding (protocol/_encode.pyx), for mypy.

from typing import Any

KINDS: dict[str, int]

def encode(program: tuple[Any, ...], answer: Any) -> bytes | None: ...
def codes(paths: tuple[Any, ...], answer: Any) -> tuple[int, ...] | None: ...
