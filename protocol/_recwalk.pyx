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
    cdef int64_t length, ts_delta, off_delta, nheaders, hklen, ts
    cdef Py_ssize_t i, j
    for i in range(records):
        p = pos
        if not _varint(buf, &p, n, 9, &length):
            return None
        # 6: the smallest record after its length (attributes and five one-byte varints)
        if length < 6 or length > n - p:
            return None
        end = p + length
        p += 1  # attributes
        if not _varint(buf, &p, end, 9, &ts_delta):
            return None
        if not _varint(buf, &p, end, 5, &off_delta):
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
