"""CRC-32C (Castagnoli), the checksum of Kafka record batches, from the ``crc32c`` package's C
extension.

Loaded without the package's ``__init__``: that reads the package's own version through
``importlib.metadata``, whose import and lookup cost every broker start about 30 ms (a tenth of
it) for a string nothing uses.  If the extension cannot be found that way (another layout,
another build), the package is imported as usual.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from collections.abc import Callable
from typing import Any


def _extension() -> Any:
    spec = importlib.util.find_spec("crc32c")  # locates the package; runs none of it
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(location, "_crc32c" + suffix)
            if os.path.exists(path):
                ext = importlib.util.spec_from_file_location("crc32c._crc32c", path)
                if ext is None or ext.loader is None:
                    continue
                module = importlib.util.module_from_spec(ext)
                ext.loader.exec_module(module)
                return module
    import crc32c as package

    return package


crc32c: Callable[..., int] = _extension().crc32c
