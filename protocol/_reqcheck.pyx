# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The request shape check, compiled (optional; built from source by Cython at install when a C
compiler is there).  Used by ``protocol/tagged.py`` ("Checked native reads").

``check`` walks a request body along a program made from its schema (``tagged._program``) and
moves over every field without making a single object: it answers the position after the
message when the bytes are a plain, well-formed message -- every array length fits in the bytes
left, every string and byte field fits, no array or string is null where the schema does not
allow it, no struct carries a tagged field, and the arrays hold no more elements than the
request's budget -- and -1 for anything else.  Only then does the caller let kio's native reader
build the message in one call; for -1 it walks the bytes in Python as before, which reads what
this refuses to vouch for (tagged fields) and words every refusal.

The program is a bytes object of native ``int``s: a struct's fields in order, then END.

    END flexible              a struct ends (a flexible one with an empty tagged-field section)
    SKIP n                    n fixed-width bytes
    STRING flexible nullable  int16 length (legacy) or uvarint length + 1 (compact)
    BYTES flexible nullable   int32 length (legacy) or uvarint length + 1 (compact)
    ARRAY_FIXED flexible nullable size      an array of fixed-width values
    ARRAY_STRING flexible nullable          an array of non-null strings
    ARRAY_STRUCT flexible nullable size at  an array of structs (program at ``at``; ``size`` the
                                            fewest bytes one takes)
    STRUCT at                 a struct
    NULLABLE_STRUCT at        a flexible nullable struct: int8 marker, -1 null, 1 present

Every read is checked against the end of the buffer before it is made, so no input reads
outside it (tests/test_request_decoders.py).
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t, int32_t, int64_t, uint64_t

cdef enum:
    END = 0
    SKIP = 1
    STRING = 2
    BYTES = 3
    ARRAY_FIXED = 4
    ARRAY_STRING = 5
    ARRAY_STRUCT = 6
    STRUCT = 7
    NULLABLE_STRUCT = 8

# the ops, for the program builder in protocol/tagged.py
OPS = {
    "END": END,
    "SKIP": SKIP,
    "STRING": STRING,
    "BYTES": BYTES,
    "ARRAY_FIXED": ARRAY_FIXED,
    "ARRAY_STRING": ARRAY_STRING,
    "ARRAY_STRUCT": ARRAY_STRUCT,
    "STRUCT": STRUCT,
    "NULLABLE_STRUCT": NULLABLE_STRUCT,
}


cdef struct Walk:
    const unsigned char *data
    Py_ssize_t end
    const int *prog
    Py_ssize_t prog_len
    int64_t elements   # array elements seen so far
    int64_t limit      # most elements allowed, -1: no limit


cdef inline Py_ssize_t _uvarint(Walk *w, Py_ssize_t pos, int64_t *out) noexcept:
    """An unsigned varint of at most 5 bytes (35 bits) at ``pos``; the position after it, or -1."""
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef unsigned char b
    while shift < 35:
        if pos >= w.end:
            return -1
        b = w.data[pos]
        pos += 1
        value |= (<uint64_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            out[0] = <int64_t>value
            return pos
        shift += 7
    return -1


cdef inline Py_ssize_t _length(Walk *w, Py_ssize_t pos, bint flexible, int width, int64_t *out) noexcept:
    """A length: uvarint minus one (compact), or a big-endian int16/int32; -1 when truncated."""
    cdef int64_t raw
    if flexible:
        pos = _uvarint(w, pos, &raw)
        if pos < 0:
            return -1
        out[0] = raw - 1
        return pos
    if pos + width > w.end:
        return -1
    if width == 2:
        out[0] = <int16_t>((<unsigned int>w.data[pos] << 8) | w.data[pos + 1])
    else:
        out[0] = <int32_t>(
            (<unsigned int>w.data[pos] << 24) | (<unsigned int>w.data[pos + 1] << 16)
            | (<unsigned int>w.data[pos + 2] << 8) | w.data[pos + 3]
        )
    return pos + width


cdef inline Py_ssize_t _sized(Walk *w, Py_ssize_t pos, bint flexible, bint nullable, int width) noexcept:
    """Move over a string (``width`` 2) or byte field (``width`` 4); -1 when it does not fit or is
    null where the schema does not allow it."""
    cdef int64_t n
    pos = _length(w, pos, flexible, width, &n)
    if pos < 0:
        return -1
    if n < 0:
        return pos if (nullable and n == -1) else -1
    if n > w.end - pos:
        return -1
    return pos + n


cdef inline Py_ssize_t _count(Walk *w, Py_ssize_t pos, bint flexible, bint nullable, int64_t size,
                              int64_t *out) noexcept:
    """An array's element count, checked to fit (``size`` bytes each at least) and counted
    against the budget; out is -1 for a null array.  -1 for anything else."""
    cdef int64_t n
    pos = _length(w, pos, flexible, 4, &n)
    if pos < 0:
        return -1
    if n < 0:
        if nullable and n == -1:
            out[0] = -1
            return pos
        return -1
    if n * size > w.end - pos:
        return -1
    w.elements += n
    if w.limit >= 0 and w.elements > w.limit:
        return -1
    out[0] = n
    return pos


cdef Py_ssize_t _struct(Walk *w, Py_ssize_t pos, Py_ssize_t pc) noexcept:
    """Move over one struct whose program starts at ``pc``; -1 when it is not a plain one."""
    cdef int op
    cdef int64_t n, i, tags
    cdef Py_ssize_t at
    cdef int size
    cdef bint flexible, nullable
    while True:
        if pc >= w.prog_len:
            return -1
        op = w.prog[pc]
        if op == END:
            if w.prog[pc + 1]:
                pos = _uvarint(w, pos, &tags)
                if pos < 0 or tags != 0:
                    return -1  # tagged fields: the Python walk reads them
            return pos
        if op == SKIP:
            size = w.prog[pc + 1]
            if pos + size > w.end:
                return -1
            pos += size
            pc += 2
        elif op == STRING or op == BYTES:
            pos = _sized(w, pos, w.prog[pc + 1], w.prog[pc + 2], 2 if op == STRING else 4)
            if pos < 0:
                return -1
            pc += 3
        elif op == ARRAY_FIXED:
            size = w.prog[pc + 3]
            pos = _count(w, pos, w.prog[pc + 1], w.prog[pc + 2], size, &n)
            if pos < 0:
                return -1
            if n > 0:
                pos += n * size  # fits: checked by _count
            pc += 4
        elif op == ARRAY_STRING:
            flexible = w.prog[pc + 1]
            pos = _count(w, pos, flexible, w.prog[pc + 2], 2 if not flexible else 1, &n)
            if pos < 0:
                return -1
            for i in range(n):
                pos = _sized(w, pos, flexible, False, 2)
                if pos < 0:
                    return -1
            pc += 3
        elif op == ARRAY_STRUCT:
            pos = _count(w, pos, w.prog[pc + 1], w.prog[pc + 2], w.prog[pc + 3], &n)
            if pos < 0:
                return -1
            at = w.prog[pc + 4]
            for i in range(n):
                pos = _struct(w, pos, at)
                if pos < 0:
                    return -1
            pc += 5
        elif op == STRUCT:
            pos = _struct(w, pos, w.prog[pc + 1])
            if pos < 0:
                return -1
            pc += 2
        elif op == NULLABLE_STRUCT:
            if pos >= w.end:
                return -1
            if w.data[pos] == 0xFF:
                pos += 1
            elif w.data[pos] == 1:
                pos = _struct(w, pos + 1, w.prog[pc + 1])
                if pos < 0:
                    return -1
            else:
                return -1
            pc += 2
        else:
            return -1


def check(bytes program, object buf, Py_ssize_t pos, int64_t limit):
    """The position after the plain message at ``pos`` in ``buf`` that ``program`` describes, or
    -1 (see the module's text).  ``limit``: the most array elements allowed, -1 for no limit."""
    cdef Py_buffer view
    cdef Walk w
    cdef Py_ssize_t end
    if pos < 0:
        return -1
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        w.data = <const unsigned char *>view.buf
        w.end = view.len
        w.prog = <const int *>PyBytes_AS_STRING(program)
        w.prog_len = PyBytes_GET_SIZE(program) // sizeof(int)
        w.elements = 0
        w.limit = limit
        if pos > w.end:
            return -1
        end = _struct(&w, pos, 0)
    finally:
        PyBuffer_Release(&view)
    return end


def client_id_and_size(object frame, int header_version):
    """(client id, header size) of a request header v1 or v2 at the start of ``frame``, as
    ``parse_request_header`` in protocol/framing.py reads them, for the usual header: a client
    id that fits (or is null) and, in v2, no tagged fields.  None for anything else: the caller
    parses the header in Python, which words what is wrong."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef Py_ssize_t n, pos
    cdef int size
    PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    try:
        p = <const unsigned char *>view.buf
        n = view.len
        if n < 10:
            return None
        size = <short>((p[8] << 8) | p[9])
        pos = 10
        if size < 0:
            client_id = None
        else:
            if pos + size > n:
                return None
            client_id = PyUnicode_DecodeUTF8(<const char *>p + pos, size, "replace")
            pos += size
        if header_version >= 2:
            if pos >= n or p[pos] != 0:
                return None
            pos += 1
        return client_id, pos
    finally:
        PyBuffer_Release(&view)
