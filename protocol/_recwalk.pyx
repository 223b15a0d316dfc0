# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The record walk of the produce check, compiled (optional; built from source by Cython at
install when a C compiler is there).

The reference is ``_walk_records`` in ``protocol/records.py``: this walks the same fields of the
same records, as Kafka's ``DefaultRecord.readFrom`` reads them.  It only ever answers for bytes
the reference accepts: whenever anything is unusual (a record that does not frame, a varint
longer than the fast cases handle, a sum outside 64 bits), it answers ``None`` and the caller
walks the same bytes with the reference, which words the error, or accepts what this was too
cautious to.  Every read is checked against the record's end before it is made, so no input
reads outside the buffer (tests/test_record_walk.py runs both on valid and corrupted bytes).
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint64_t, INT64_MAX, INT64_MIN


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
                               Py_ssize_t *kpos, int64_t *klen, Py_ssize_t *vpos, int64_t *vlen) noexcept:
    """One record from ``pos`` (as ``_walk_records`` frames it) with a key of two bytes or more
    and no headers; False when it is not one."""
    cdef Py_ssize_t p = pos[0]
    cdef Py_ssize_t end
    cdef int64_t ts_delta, off_delta
    if not _record_head(buf, &p, n, &end, &ts_delta, &off_delta):
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
    cdef Py_ssize_t size, end, p, rp, kpos, vpos, i
    cdef int64_t base_offset, batch_length, count, last_delta, klen, vlen
    cdef int attributes, version
    cdef uint64_t stored
    cdef Py_ssize_t batches = 0, records = 0
    if n == 0:
        return pos, expected, 0, 0
    buf = &data[0]
    view = memoryview(segment)
    try:
        while pos >= 0 and n - pos >= 61:
            base_offset = _be(buf + pos, 8)
            batch_length = _be(buf + pos + 8, 4)
            if batch_length < 49 or batch_length > n - pos - 12:
                break
            size = batch_length + 12
            end = pos + size
            if buf[pos + 16] != 2:  # magic
                break
            attributes = <int>_be(buf + pos + 21, 2)
            if attributes & 0x07 or attributes & 0x30:  # compressed, transactional or control
                break
            last_delta = _be(buf + pos + 23, 4)
            count = _be(buf + pos + 57, 4)
            # the next offset (base offset + lastOffsetDelta + 1) stays far inside 64 bits
            if count < 0 or last_delta < 0 or base_offset < expected or base_offset > INT64_MAX - (<int64_t>1 << 40):
                break
            if count > (size - 61) // 7:
                break
            # every record first, without a side effect: the batch is taken whole or not at all
            rp = pos + 61
            for i in range(count):
                if not _plain_record(buf, &rp, end, &kpos, &klen, &vpos, &vlen):
                    break
            else:
                i = count
            if i != count or rp != end:
                break
            stored = <uint64_t>_be(buf + pos + 17, 4) & 0xFFFFFFFF
            piece = view[pos + 21 : end]
            try:
                if crc(piece) != stored:
                    break
            finally:
                piece.release()
            rp = pos + 61
            for i in range(count):
                _plain_record(buf, &rp, end, &kpos, &klen, &vpos, &vlen)
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
