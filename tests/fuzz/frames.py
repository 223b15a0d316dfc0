"""Request frames on disk: the corpus and regression files.

A ``.frames`` file is a raw Kafka request stream: each frame is ``int32 size`` + ``size`` bytes,
back to back, exactly as a client writes them to its socket (``kcat``-free: read it with
:func:`read_frames`, or ``xxd``).  The corpus holds one file per client
(``corpus/<client>.frames``); a regression case is one file per finding
(``regressions/<name>.frames``) whose frames are sent in order on one connection, and may
contain frames whose size prefix lies (that is the point of some cases) — :func:`read_stream`
returns such a file as one blob to send as is.  A case over 64 KB is stored gzipped
(``.frames.gz``); a case of several connections is a ``.frames`` directory of such files.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS_DIR = HERE / "corpus"
REGRESSIONS_DIR = HERE / "regressions"

_SIZE = struct.Struct(">i")
_HDR = struct.Struct(">hhi")


@dataclass(frozen=True, slots=True)
class Frame:
    """One request frame body (the bytes after the size) and where it came from."""

    source: str
    body: bytes

    @property
    def api_key(self) -> int:
        return _HDR.unpack_from(self.body, 0)[0] if len(self.body) >= 8 else -1

    @property
    def api_version(self) -> int:
        return _HDR.unpack_from(self.body, 0)[1] if len(self.body) >= 8 else -1

    def wire(self) -> bytes:
        return _SIZE.pack(len(self.body)) + self.body


def split_frames(data: bytes) -> Iterator[bytes]:
    """Bodies of the size-prefixed frames in ``data`` (a truncated last frame ends it)."""
    pos = 0
    while pos + 4 <= len(data):
        (size,) = _SIZE.unpack_from(data, pos)
        if size < 0 or pos + 4 + size > len(data):
            return
        yield data[pos + 4 : pos + 4 + size]
        pos += 4 + size


def read_frames(path: Path) -> list[Frame]:
    return [Frame(path.stem, body) for body in split_frames(path.read_bytes())]


def write_frames(path: Path, bodies: Iterable[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(_SIZE.pack(len(b)) + b for b in bodies))


def load_corpus(directory: Path = CORPUS_DIR) -> list[Frame]:
    frames: list[Frame] = []
    for path in sorted(directory.glob("*.frames")):
        frames.extend(read_frames(path))
    return frames


def read_stream(path: Path) -> bytes:
    """A regression file's bytes, to be sent as they are (size prefixes included); a
    ``.frames.gz`` file is gunzipped (large cases are mostly one element repeated)."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def write_case(path: Path, wire: bytes) -> Path:
    """Write a regression case; over 64 KB as ``<path>.gz``.  Returns the path written."""
    if len(wire) > 64 * 1024:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(wire, mtime=0))
    else:
        path.write_bytes(wire)
    return path


def regression_cases(directory: Path = REGRESSIONS_DIR) -> list[Path]:
    """The regression cases: ``*.frames`` / ``*.frames.gz`` files and ``*.frames`` directories."""
    return sorted(p for p in directory.iterdir() if p.name.endswith((".frames", ".frames.gz")))


def case_wires(case: Path) -> list[bytes]:
    """What a regression case sends: one blob per connection, in order."""
    if case.is_dir():
        return [read_stream(p) for p in regression_cases(case)]
    return [read_stream(case)]
