# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Record walks, compiled (optional; built from source by Cython at install when a C compiler is
there): the produce check's (``walk_times``), the offsets-log replay's (``scan_offsets_batches``,
with ``fold_offsets`` applying what it took, and the key and value readers
``offset_commit_key_parts`` and ``offset_commit_value_v3_parts``) and the pipeline's offset rows
(``OffsetRows``); and one writer, the offsets log's batch builder (``build_plain_batch``).
Each has a Python reference that the tests run on the same bytes, and each answers only for
bytes the reference accepts (the writer: only for entries the reference takes, with its bytes).

The produce walk's reference is ``_walk_records`` in ``protocol/records.py``: this walks the same
fields of the same records, as Kafka's ``DefaultRecord.readFrom`` reads them.  Whenever anything
is unusual (a record that does not frame, a varint longer than the fast cases handle, a sum
outside 64 bits), it answers ``None`` and the caller walks the same bytes with the reference,
which words the error, or accepts what this was too cautious to.  Every read is checked against
the record's end before it is made, so no input reads outside the buffer
(tests/test_record_walk.py, tests/test_replay_scan.py, tests/test_pipeline_compiled.py).
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint64_t, INT64_MAX, INT64_MIN
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy


cdef inline bint _varint(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t end,
                         int max_bytes, int64_t *out) noexcept:
    """A zig-zag varint of at most ``max_bytes`` bytes (at most 9, so it fits in 63 bits) that
    ends before ``end``; False when it does not."""
    cdef uint64_t raw = 0
    cdef int shift = 0
    cdef Py_ssize_t p = pos[0]
    cdef unsigned char b
    cdef int i
    for i in range(max_bytes):
        if p >= end:
            return False
        b = data[p]
        p += 1
        raw |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = <int64_t>(raw >> 1) ^ -(<int64_t>(raw & 1))
            pos[0] = p
            return True
        shift += 7
    return False


cdef inline bint _skip_bytes(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t end) noexcept:
    """A varint length and that many bytes (a negative length: null, nothing follows), all
    before ``end``; False when they are not."""
    cdef int64_t size
    if not _varint(data, pos, end, 5, &size):
        return False
    if size > 0:
        if size > end - pos[0]:
            return False
        pos[0] += size
    return True


cdef inline bint _record_head(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t n, Py_ssize_t *end,
                              int64_t *ts_delta, int64_t *off_delta) noexcept:
    """A record's length (its ``end``), attributes, timestampDelta and offsetDelta, from
    ``pos``, all before ``n``; False when they are not there."""
    cdef int64_t length
    if not _varint(data, pos, n, 9, &length):
        return False
    # 6: the smallest record after its length (attributes and five one-byte varints)
    if length < 6 or length > n - pos[0]:
        return False
    end[0] = pos[0] + length
    pos[0] += 1  # attributes
    if not _varint(data, pos, end[0], 9, ts_delta):
        return False
    return _varint(data, pos, end[0], 5, off_delta)


def walk_times(const unsigned char[:] data, Py_ssize_t pos, Py_ssize_t records, int64_t base_ts,
               bint log_append_time, int64_t max_timestamp, int64_t best_ts, int64_t best_delta):
    """Walk ``records`` records from ``pos``: (position after them, the latest timestamp among
    them and ``best_ts``, the offset delta of the first record holding it), or ``None``."""
    cdef Py_ssize_t n = data.shape[0]
    if records <= 0:
        return pos, best_ts, best_delta
    if pos < 0 or pos >= n:
        return None
    cdef const unsigned char *buf = &data[0]
    cdef Py_ssize_t end, p
    cdef int64_t ts_delta, off_delta, nheaders, hklen, ts
    cdef Py_ssize_t i, j
    for i in range(records):
        p = pos
        if not _record_head(buf, &p, n, &end, &ts_delta, &off_delta):
            return None
        if not _skip_bytes(buf, &p, end):  # key
            return None
        if not _skip_bytes(buf, &p, end):  # value
            return None
        if not _varint(buf, &p, end, 5, &nheaders):
            return None
        if nheaders < 0 or nheaders > end - p:
            return None
        for j in range(nheaders):
            if not _varint(buf, &p, end, 5, &hklen):
                return None
            if hklen < 0 or hklen > end - p:
                return None
            p += hklen
            if not _skip_bytes(buf, &p, end):  # header value
                return None
        if p != end:
            return None
        if log_append_time:
            ts = max_timestamp
        else:
            if (ts_delta > 0 and base_ts > INT64_MAX - ts_delta) or (ts_delta < 0 and base_ts < INT64_MIN - ts_delta):
                return None
            ts = base_ts + ts_delta
        if ts > best_ts:
            best_ts = ts
            best_delta = off_delta
        pos = end
    return pos, best_ts, best_delta


# --- the replay scan of __consumer_offsets segments ---------------------------------------------
#
# The reference is the recovery path of coordinator/storage/segments.py (``SegmentReader``:
# ``read_header`` and ``decode_records`` per batch) feeding ``StateBuilder.add`` in
# coordinator/storage/loader.py.  This takes only batches that path accepts and that the loader
# treats alike: v2, complete, CRC correct, counts and deltas not negative, base offset not below
# the expected one, uncompressed, neither transactional nor control, every record with a key of
# at least two bytes and no headers, the records filling the batch exactly.  It stops before the
# first batch that is anything else; the reference reads that batch (and words its error).

cdef inline int64_t _be(const unsigned char *p, int size) noexcept:
    """A big-endian signed integer of ``size`` (2, 4 or 8) bytes."""
    cdef uint64_t v = 0
    cdef int i
    for i in range(size):
        v = (v << 8) | p[i]
    if size < 8 and (v >> (8 * size - 1)) & 1:
        v |= (<uint64_t>-1) << (8 * size)
    return <int64_t>v


cdef inline bint _plain_record(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t n,
                               Py_ssize_t *kpos, int64_t *klen, Py_ssize_t *vpos, int64_t *vlen,
                               int64_t *ts_delta, int64_t *off_delta) noexcept:
    """One record from ``pos`` (as ``_walk_records`` frames it) with a key of two bytes or more
    and no headers; False when it is not one."""
    cdef Py_ssize_t p = pos[0]
    cdef Py_ssize_t end
    if not _record_head(buf, &p, n, &end, ts_delta, off_delta):
        return False
    if not _varint(buf, &p, end, 5, klen):
        return False
    if klen[0] < 2 or klen[0] > end - p:
        return False
    kpos[0] = p
    p += klen[0]
    if not _varint(buf, &p, end, 5, vlen):
        return False
    vpos[0] = p
    if vlen[0] > 0:
        if vlen[0] > end - p:
            return False
        p += vlen[0]
    if p >= end or buf[p] != 0:  # header count: none
        return False
    p += 1
    if p != end:
        return False
    pos[0] = end
    return True


cdef int _take_batch(const unsigned char *buf, Py_ssize_t n, Py_ssize_t pos, int64_t expected,
                     object view, object crc, Py_ssize_t *end, int64_t *base_offset,
                     int64_t *count, int64_t *last_delta) except -1:
    """1 when the batch at ``pos`` is one the compiled scans take (above: its header, every
    record's framing and its CRC-32C checked, nothing else done), else 0."""
    cdef int64_t batch_length
    cdef Py_ssize_t size, rp, kpos, vpos, i
    cdef int64_t klen, vlen, ts_delta, off_delta
    cdef int attributes
    cdef uint64_t stored
    if pos < 0 or n - pos < 61:
        return 0
    base_offset[0] = _be(buf + pos, 8)
    batch_length = _be(buf + pos + 8, 4)
    if batch_length < 49 or batch_length > n - pos - 12:
        return 0
    size = batch_length + 12
    end[0] = pos + size
    if buf[pos + 16] != 2:  # magic
        return 0
    attributes = <int>_be(buf + pos + 21, 2)
    if attributes & 0x07 or attributes & 0x30:  # compressed, transactional or control
        return 0
    last_delta[0] = _be(buf + pos + 23, 4)
    count[0] = _be(buf + pos + 57, 4)
    # the next offset (base offset + lastOffsetDelta + 1) stays far inside 64 bits
    if (count[0] < 0 or last_delta[0] < 0 or base_offset[0] < expected
            or base_offset[0] > INT64_MAX - (<int64_t>1 << 40)):
        return 0
    if count[0] > (size - 61) // 7:
        return 0
    rp = pos + 61
    for i in range(count[0]):
        if not _plain_record(buf, &rp, end[0], &kpos, &klen, &vpos, &vlen, &ts_delta, &off_delta):
            return 0
    if rp != end[0]:
        return 0
    stored = <uint64_t>_be(buf + pos + 17, 4) & 0xFFFFFFFF
    piece = view[pos + 21 : end[0]]
    try:
        if crc(piece) != stored:
            return 0
    finally:
        piece.release()
    return 1


def scan_offsets_batches(object segment, Py_ssize_t pos, int64_t expected, dict last, list others, object crc):
    """Scan the batches of ``segment`` (bytes or mmap) from ``pos`` while each is one the
    loader's fast path takes (above).  A record whose key's version is 0, 1 or 2 (offset commit,
    group metadata) sets ``last[key] = (batch base offset, value or None, reset)``,
    ``reset`` telling whether a tombstone of the key came before it (then the key is moved to the
    end of ``last``, as a dict that pops tombstoned keys orders them); any other key appends
    ``(key, value)`` to ``others``.  ``crc`` is the CRC-32C function.

    Returns (position after the last batch taken, the offset after it, batches, records); a
    batch is taken whole or not at all."""
    cdef const unsigned char[:] data = segment
    cdef Py_ssize_t n = data.shape[0]
    cdef const unsigned char *buf
    cdef Py_ssize_t end, rp, kpos, vpos, i
    cdef int64_t base_offset, count, last_delta, klen, vlen, ts_delta, off_delta
    cdef int version
    cdef Py_ssize_t batches = 0, records = 0
    if n == 0:
        return pos, expected, 0, 0
    buf = &data[0]
    view = memoryview(segment)
    try:
        while _take_batch(buf, n, pos, expected, view, crc, &end, &base_offset, &count, &last_delta):
            rp = pos + 61
            for i in range(count):
                _plain_record(buf, &rp, end, &kpos, &klen, &vpos, &vlen, &ts_delta, &off_delta)
                key = PyBytes_FromStringAndSize(<const char *>buf + kpos, klen)
                value = None if vlen < 0 else PyBytes_FromStringAndSize(<const char *>buf + vpos, vlen)
                version = <int>_be(buf + kpos, 2)
                if 0 <= version <= 2:
                    # the 3rd field: a tombstone of the key came before (the loader's dicts
                    # then take the key anew, at the end: dict order as the reference's)
                    prev = last.get(key)
                    if value is None:
                        if prev is not None:
                            del last[key]
                        last[key] = (base_offset, None, True)
                    elif prev is None:
                        last[key] = (base_offset, value, False)
                    elif prev[1] is None:
                        del last[key]
                        last[key] = (base_offset, value, True)
                    else:
                        last[key] = (base_offset, value, prev[2])
                else:
                    others.append((key, value))
            records += count
            batches += 1
            expected = base_offset + last_delta + 1
            pos = end
    finally:
        view.release()
    return pos, expected, batches, records


def fold_offsets(dict last, dict keys, object key_of, object commit_key, object group_key, dict offsets, dict groups):
    """Fold what ``scan_offsets_batches`` put in ``last`` into the loader's state (the loop of
    ``StateBuilder._fold`` in coordinator/storage/loader.py, whose docstring says what it
    must do): ``keys`` caches raw key -> (decoded key or error message, canonical bytes) and
    ``key_of(raw)`` fills it; offset commits go to ``offsets`` by canonical bytes, group records
    to ``groups`` by group id.  Returns None, or why the reference reader must redo the run (two
    raw keys for one key, or a key that is neither)."""
    cdef set seen = set()
    cdef tuple entry, got
    cdef dict target
    cdef object raw, key, ident, value
    for raw, entry in last.items():
        got = keys.get(raw)
        if got is None:
            got = key_of(raw)
        key = got[0]
        if type(key) is commit_key:
            ident, target = got[1], offsets  # canonical bytes
        elif type(key) is group_key:
            ident, target = key.group, groups
        else:
            return str(key)
        if ident in seen:
            return f"two raw keys for {key}" if target is offsets else f"two raw keys for group {ident!r}"
        seen.add(ident)
        value = entry[1]
        if value is None or entry[2]:
            target.pop(ident, None)
        if value is not None:
            target[ident] = (entry[0], value) if target is offsets else value
    return None


cdef inline Py_ssize_t _classic_str(const unsigned char *p, Py_ssize_t pos, Py_ssize_t n) noexcept:
    """The end of the non-null classic STRING (int16 length + bytes) at ``pos``, or -1 when it
    is null or runs past ``n``."""
    cdef Py_ssize_t size
    if pos + 2 > n:
        return -1
    size = (p[pos] << 8) | p[pos + 1]
    if size & 0x8000 or pos + 2 + size > n:
        return -1
    return pos + 2 + size


def offset_commit_key_parts(bytes raw):
    """(group, topic, partition, canonical) of an offset commit key of version 0 or 1, as
    ``decode_key`` in protocol/offsets_schema.py reads it; ``canonical``: the key is the bytes
    version 1 writes for it (nothing after the partition).  None for anything else (another
    version, a string that is null, cut short or not UTF-8, no room for the partition): the
    reference decodes it and words the error."""
    cdef const unsigned char *p = raw
    cdef Py_ssize_t n = len(raw)
    cdef Py_ssize_t g_end, t_end
    if n < 2 or p[0] != 0 or p[1] > 1:
        return None
    g_end = _classic_str(p, 2, n)
    if g_end < 0:
        return None
    t_end = _classic_str(p, g_end, n)
    if t_end < 0 or t_end + 4 > n:
        return None
    try:
        group = PyUnicode_DecodeUTF8(<const char *>p + 4, g_end - 4, NULL)
        topic = PyUnicode_DecodeUTF8(<const char *>p + g_end + 2, t_end - g_end - 2, NULL)
    except UnicodeDecodeError:
        return None
    return group, topic, <int32_t>_be(p + t_end, 4), p[1] == 1 and t_end + 4 == n


def offset_commit_value_v3_parts(bytes raw):
    """(offset, metadata, commit timestamp, leader epoch) of an offset commit value of version 3
    (what Kafka writes), as ``decode_offset_commit_value`` reads it, or None for anything else
    (the reference decodes it)."""
    cdef const unsigned char *p = raw
    cdef Py_ssize_t n = len(raw)
    cdef Py_ssize_t m_end
    if n < 14 or p[0] != 0 or p[1] != 3:
        return None
    m_end = _classic_str(p, 14, n)
    if m_end < 0 or m_end + 8 > n:
        return None
    try:
        metadata = PyUnicode_DecodeUTF8(<const char *>p + 16, m_end - 16, NULL)
    except UnicodeDecodeError:
        return None
    return _be(p + 2, 8), metadata, _be(p + m_end, 8), <int32_t>_be(p + 10, 4)


# --- the pipeline's offset rows ---------------------------------------------------------------
# ``OffsetRows.scan`` takes the same batches as the replay scan and decodes their offset commit
# records straight into Arrow column buffers: the ``offset`` rows of pipeline/decode.py, whose
# per-record Python code is the reference.  A record is decoded here only when it is an offset
# commit key (version 0 or 1) with ASCII strings and, unless a tombstone, a value of version 0
# to 3 with an ASCII metadata string, every field inside the bytes; any other record goes back
# to the caller whole, for the reference to make its row (or word its error).  ASCII: it is valid
# UTF-8 as it stands, so the bytes are the column's bytes.

cdef struct _Buf:
    char *p
    Py_ssize_t n
    Py_ssize_t cap


cdef int _reserve(_Buf *b, Py_ssize_t extra) except -1:
    """Room for ``extra`` more bytes."""
    cdef Py_ssize_t want = b.n + extra
    cdef Py_ssize_t cap
    cdef char *p
    if want <= b.cap:
        return 0
    cap = b.cap * 2
    if cap < want:
        cap = want
    if cap < 4096:
        cap = 4096
    p = <char *>realloc(b.p, cap)
    if p == NULL:
        raise MemoryError()
    b.p = p
    b.cap = cap
    return 0


cdef inline void _put64(_Buf *b, int64_t v) noexcept:
    memcpy(b.p + b.n, &v, 8)
    b.n += 8


cdef inline void _put32(_Buf *b, int32_t v) noexcept:
    memcpy(b.p + b.n, &v, 4)
    b.n += 4


cdef inline void _put16(_Buf *b, int16_t v) noexcept:
    memcpy(b.p + b.n, &v, 2)
    b.n += 2


cdef inline void _put8(_Buf *b, uint8_t v) noexcept:
    b.p[b.n] = <char>v
    b.n += 1


cdef inline void _putstr(_Buf *offsets, _Buf *data, const unsigned char *src, Py_ssize_t size) noexcept:
    memcpy(data.p + data.n, src, size)
    data.n += size
    _put32(offsets, <int32_t>data.n)


cdef inline bint _ascii_string(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end,
                               Py_ssize_t *start, Py_ssize_t *size) noexcept:
    """A non-null classic STRING (int16 length) of ASCII bytes at ``pos``, inside ``end``."""
    cdef Py_ssize_t stop = _classic_str(buf, pos[0], end)
    cdef Py_ssize_t i
    if stop < 0:
        return False
    for i in range(pos[0] + 2, stop):
        if buf[i] >= 0x80:
            return False
    start[0] = pos[0] + 2
    size[0] = stop - start[0]
    pos[0] = stop
    return True


# the column buffers of OffsetRows, by index: int64 columns, int32 ones (string offsets
# included), int16 ones, one byte per row, string bytes
cdef enum:
    LOG_OFFSET, BATCH_OFFSET, TIMESTAMP, PRODUCER_ID, OFFSET, COMMIT_TIMESTAMP, EXPIRE_TIMESTAMP
    PARTITION, LEADER_EPOCH, GROUP_OFFSETS, TOPIC_OFFSETS, METADATA_OFFSETS
    KEY_VERSION, VALUE_VERSION
    TOMBSTONE, EXPIRE_VALID
    GROUP_DATA, TOPIC_DATA, METADATA_DATA
    N_BUFS

_BUF_NAMES = (
    "log_offset", "batch_offset", "timestamp", "producer_id", "offset", "commit_timestamp", "expire_timestamp",
    "partition", "leader_epoch", "group_offsets", "topic_offsets", "metadata_offsets",
    "key_version", "value_version",
    "tombstone", "expire_valid",
    "group_data", "topic_data", "metadata_data",
)


cdef class OffsetRows:
    """Column buffers of offset rows, filled by :meth:`scan` and handed over by :meth:`take`."""

    cdef _Buf bufs[<int>N_BUFS]
    cdef readonly Py_ssize_t rows
    # the base offset of the first batch taken since this was made, or -1
    cdef readonly int64_t first_offset

    def __cinit__(self):
        self.first_offset = -1
        self._restart()

    def __dealloc__(self):
        cdef int i
        for i in range(N_BUFS):
            free(self.bufs[i].p)
            self.bufs[i].p = NULL

    cdef int _restart(self) except -1:
        cdef int i
        for i in range(N_BUFS):
            self.bufs[i].n = 0
        for i in (GROUP_OFFSETS, TOPIC_OFFSETS, METADATA_OFFSETS):
            _reserve(&self.bufs[i], 4)
            _put32(&self.bufs[i], 0)
        self.rows = 0
        return 0

    def take(self):
        """(rows, {column: bytes}) of the rows made since the last take, and start anew.  Numbers
        in native byte order; ``tombstone`` and ``expire_valid`` one byte (0 or 1) per row;
        strings as ``<name>_offsets`` (int32, rows + 1) and ``<name>_data``."""
        cdef Py_ssize_t n = self.rows
        cdef int i
        cols = {}
        for i in range(N_BUFS):
            cols[_BUF_NAMES[i]] = PyBytes_FromStringAndSize(self.bufs[i].p, self.bufs[i].n)
        self._restart()
        return n, cols

    def scan(self, object segment, Py_ssize_t pos, int64_t expected, object crc, list rest, Py_ssize_t max_rows):
        """Take batches from ``pos`` as ``scan_offsets_batches`` does, while fewer than
        ``max_rows`` rows are held: each record becomes a row here or goes to ``rest`` as
        (batch base offset, producer id, offset, timestamp, key, value), in log order.

        Returns (position after the last batch taken, the offset after it, batches, records)."""
        cdef const unsigned char[:] data = segment
        cdef Py_ssize_t n = data.shape[0]
        cdef const unsigned char *buf
        cdef const unsigned char *k
        cdef const unsigned char *v
        cdef Py_ssize_t end, rp, kpos, vpos, i, j, p, gpos, glen, tpos, tlen, mpos, mlen
        cdef int64_t base_offset, count, last_delta, klen, vlen, ts_delta, off_delta
        cdef int64_t base_ts, max_ts, pid, ts, off, off_val, commit_ts, expire
        cdef int32_t part, epoch
        cdef int kv, vv
        cdef bint log_append, ts_ok, expire_set
        cdef Py_ssize_t batches = 0, records = 0
        if n == 0:
            return pos, expected, 0, 0
        buf = &data[0]
        view = memoryview(segment)
        try:
            while self.rows < max_rows and _take_batch(buf, n, pos, expected, view, crc, &end, &base_offset,
                                                        &count, &last_delta):
                # string bytes come from the batch: its size bounds them (int32 offsets)
                if self.bufs[GROUP_DATA].n + self.bufs[TOPIC_DATA].n + self.bufs[METADATA_DATA].n > 0x7FFFFFFF - (end - pos):
                    break
                for j in range(N_BUFS):
                    if j <= EXPIRE_TIMESTAMP:
                        _reserve(&self.bufs[j], 8 * count)
                    elif j <= METADATA_OFFSETS:
                        _reserve(&self.bufs[j], 4 * count)
                    elif j <= VALUE_VERSION:
                        _reserve(&self.bufs[j], 2 * count)
                    elif j <= EXPIRE_VALID:
                        _reserve(&self.bufs[j], count)
                    else:
                        _reserve(&self.bufs[j], end - pos)
                if self.first_offset < 0:
                    self.first_offset = base_offset
                log_append = (_be(buf + pos + 21, 2) & 0x08) != 0
                base_ts = _be(buf + pos + 27, 8)
                max_ts = _be(buf + pos + 35, 8)
                pid = _be(buf + pos + 43, 8)
                rp = pos + 61
                for i in range(count):
                    _plain_record(buf, &rp, end, &kpos, &klen, &vpos, &vlen, &ts_delta, &off_delta)
                    off = base_offset + off_delta
                    if log_append:
                        ts, ts_ok = max_ts, True
                    else:
                        ts_ok = not ((ts_delta > 0 and base_ts > INT64_MAX - ts_delta)
                                     or (ts_delta < 0 and base_ts < INT64_MIN - ts_delta))
                        ts = base_ts + ts_delta if ts_ok else 0
                    # the key: version 0 or 1, group, topic, partition
                    k = buf + kpos
                    kv = <int>_be(k, 2)
                    p = 2
                    if (not ts_ok or (kv != 0 and kv != 1) or not _ascii_string(k, &p, klen, &gpos, &glen)
                            or not _ascii_string(k, &p, klen, &tpos, &tlen) or klen - p < 4):
                        self._rest(rest, buf, base_offset, pid, off, base_ts, ts_delta, ts, ts_ok,
                                   kpos, klen, vpos, vlen)
                        continue
                    part = <int32_t>_be(k + p, 4)
                    vv = -1
                    if vlen >= 0:
                        # the value: version 0 to 3
                        v = buf + vpos
                        if vlen < 2:
                            vv = 4
                        else:
                            vv = <int>_be(v, 2)
                        expire_set = False
                        expire = 0
                        epoch = -1
                        if vv == 3:
                            p = 14
                            if vlen < 14 or not _ascii_string(v, &p, vlen, &mpos, &mlen) or vlen - p < 8:
                                vv = 4
                            else:
                                off_val = _be(v + 2, 8)
                                epoch = <int32_t>_be(v + 10, 4)
                        elif 0 <= vv <= 2:
                            p = 10
                            if vlen < 10 or not _ascii_string(v, &p, vlen, &mpos, &mlen) or vlen - p < 8:
                                vv = 4
                            elif vv == 1 and vlen - p < 16:
                                vv = 4
                            else:
                                off_val = _be(v + 2, 8)
                                if vv == 1:
                                    expire = _be(v + p + 8, 8)
                                    expire_set = expire != -1
                        else:
                            vv = 4
                        if vv == 4:
                            self._rest(rest, buf, base_offset, pid, off, base_ts, ts_delta, ts, ts_ok,
                                       kpos, klen, vpos, vlen)
                            continue
                        commit_ts = _be(v + p, 8)
                    # a row
                    _put64(&self.bufs[LOG_OFFSET], off)
                    _put64(&self.bufs[BATCH_OFFSET], base_offset)
                    _put64(&self.bufs[TIMESTAMP], ts)
                    _put64(&self.bufs[PRODUCER_ID], pid)
                    _put16(&self.bufs[KEY_VERSION], <int16_t>kv)
                    _putstr(&self.bufs[GROUP_OFFSETS], &self.bufs[GROUP_DATA], k + gpos, glen)
                    _putstr(&self.bufs[TOPIC_OFFSETS], &self.bufs[TOPIC_DATA], k + tpos, tlen)
                    _put32(&self.bufs[PARTITION], part)
                    if vlen < 0:
                        _put8(&self.bufs[TOMBSTONE], 1)
                        _put16(&self.bufs[VALUE_VERSION], 0)
                        _put64(&self.bufs[OFFSET], 0)
                        _put32(&self.bufs[LEADER_EPOCH], 0)
                        _put32(&self.bufs[METADATA_OFFSETS], <int32_t>self.bufs[METADATA_DATA].n)
                        _put64(&self.bufs[COMMIT_TIMESTAMP], 0)
                        _put8(&self.bufs[EXPIRE_VALID], 0)
                        _put64(&self.bufs[EXPIRE_TIMESTAMP], 0)
                    else:
                        _put8(&self.bufs[TOMBSTONE], 0)
                        _put16(&self.bufs[VALUE_VERSION], <int16_t>vv)
                        _put64(&self.bufs[OFFSET], off_val)
                        _put32(&self.bufs[LEADER_EPOCH], epoch)
                        _putstr(&self.bufs[METADATA_OFFSETS], &self.bufs[METADATA_DATA], v + mpos, mlen)
                        _put64(&self.bufs[COMMIT_TIMESTAMP], commit_ts)
                        _put8(&self.bufs[EXPIRE_VALID], 1 if expire_set else 0)
                        _put64(&self.bufs[EXPIRE_TIMESTAMP], expire if expire_set else 0)
                    self.rows += 1
                records += count
                batches += 1
                expected = base_offset + last_delta + 1
                pos = end
        finally:
            view.release()
        return pos, expected, batches, records

    cdef int _rest(self, list rest, const unsigned char *buf, int64_t base_offset, int64_t pid, int64_t off,
                   int64_t base_ts, int64_t ts_delta, int64_t ts, bint ts_ok,
                   Py_ssize_t kpos, int64_t klen, Py_ssize_t vpos, int64_t vlen) except -1:
        key = PyBytes_FromStringAndSize(<const char *>buf + kpos, klen)
        value = None if vlen < 0 else PyBytes_FromStringAndSize(<const char *>buf + vpos, vlen)
        timestamp = ts if ts_ok else (<object>base_ts) + (<object>ts_delta)
        rest.append((base_offset, pid, off, timestamp, key, value))
        return 0


# ------------------------------------------------------------------ the offsets log's batches

cdef inline Py_ssize_t _zigzag_size(int64_t n) noexcept:
    cdef uint64_t v = (<uint64_t>n << 1) ^ <uint64_t>(n >> 63)
    cdef Py_ssize_t size = 1
    while v > 0x7F:
        v >>= 7
        size += 1
    return size


cdef inline Py_ssize_t _put_zigzag(unsigned char *p, Py_ssize_t pos, int64_t n) noexcept:
    cdef uint64_t v = (<uint64_t>n << 1) ^ <uint64_t>(n >> 63)
    while v > 0x7F:
        p[pos] = <unsigned char>((v & 0x7F) | 0x80)
        pos += 1
        v >>= 7
    p[pos] = <unsigned char>v
    return pos + 1


cdef inline void _put_be(unsigned char *p, Py_ssize_t pos, int64_t v, int width) noexcept:
    cdef int i
    for i in range(width):
        p[pos + width - 1 - i] = <unsigned char>(v & 0xFF)
        v >>= 8


cdef inline Py_ssize_t _record_body_size(Py_ssize_t i, Py_ssize_t klen, Py_ssize_t vlen) noexcept:
    """The bytes of a log record after its length: attributes, timestampDelta 0, offsetDelta
    ``i``, the key and value with their lengths (-1: null), no headers."""
    return (1 + 1 + _zigzag_size(i) + _zigzag_size(klen) + (klen if klen > 0 else 0)
            + _zigzag_size(vlen) + (vlen if vlen > 0 else 0) + 1)


def build_plain_batch(int64_t base_offset, list entries, int64_t timestamp, int32_t leader_epoch, object crc):
    """The batch ``build_batch`` in protocol/records.py makes (its reference: ``encode_batch``):
    records at offsets ``base_offset`` + i with the one ``timestamp``, keys and values of
    ``entries`` (bytes, or None), no headers; no producer, CreateTime, uncompressed.  ``crc`` is
    the CRC-32C function.  None for anything else (an entry that is not a pair of bytes or None,
    no entries, a batch above 2 GiB): the reference then builds it, or raises."""
    cdef Py_ssize_t n = len(entries)
    cdef Py_ssize_t i, size, body, pos, total = 61
    cdef Py_ssize_t klen, vlen
    cdef object key, value
    cdef tuple entry
    cdef bytearray out
    cdef unsigned char *p
    if n == 0 or n > 0x7FFFFFFF:
        return None
    for i in range(n):  # the size first: one allocation
        entry = entries[i] if type(entries[i]) is tuple else None
        if entry is None or len(entry) != 2:
            return None
        key, value = entry
        if key is not None and type(key) is not bytes or value is not None and type(value) is not bytes:
            return None
        klen = -1 if key is None else len(<bytes>key)
        vlen = -1 if value is None else len(<bytes>value)
        body = _record_body_size(i, klen, vlen)
        total += _zigzag_size(body) + body
        if total > 0x7FFFFFFF:
            return None
    out = bytearray(total)
    p = <unsigned char *>(<char *>out)
    _put_be(p, 0, base_offset, 8)
    _put_be(p, 8, total - 12, 4)          # batchLength: after baseOffset and itself
    _put_be(p, 12, leader_epoch, 4)
    p[16] = 2                             # magic
    _put_be(p, 21, 0, 2)                  # attributes
    _put_be(p, 23, n - 1, 4)              # lastOffsetDelta
    _put_be(p, 27, timestamp, 8)          # baseTimestamp
    _put_be(p, 35, timestamp, 8)          # maxTimestamp
    _put_be(p, 43, -1, 8)                 # producerId
    _put_be(p, 51, -1, 2)                 # producerEpoch
    _put_be(p, 53, -1, 4)                 # baseSequence
    _put_be(p, 57, n, 4)                  # records
    pos = 61
    for i in range(n):
        key, value = <tuple>entries[i]
        klen = -1 if key is None else len(<bytes>key)
        vlen = -1 if value is None else len(<bytes>value)
        body = _record_body_size(i, klen, vlen)
        pos = _put_zigzag(p, pos, body)
        p[pos] = 0                        # attributes
        p[pos + 1] = 0                    # timestampDelta: zig-zag 0
        pos = _put_zigzag(p, pos + 2, i)  # offsetDelta
        pos = _put_zigzag(p, pos, klen)
        if klen > 0:
            memcpy(p + pos, <const char *>(<bytes>key), klen)
            pos += klen
        pos = _put_zigzag(p, pos, vlen)
        if vlen > 0:
            memcpy(p + pos, <const char *>(<bytes>value), vlen)
            pos += vlen
        p[pos] = 0                        # headers: zig-zag 0
        pos += 1
    view = memoryview(out)
    try:
        _put_be(p, 17, <int64_t>(<uint64_t>crc(view[21:]) & 0xFFFFFFFF), 4)
    finally:
        view.release()
    return bytes(out)
