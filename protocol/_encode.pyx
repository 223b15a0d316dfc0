# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Response encoding, compiled (optional; built from source by Cython at install when a C
compiler is there).  Used by ``protocol/response_encoders.py`` ("Compiled programs").

``encode`` lays out a handler's answer (plain dicts, lists and tuples) along a program made
from the response schema by ``response_encoders.program``, and answers the body's bytes -- or
None for anything it was not made for: a value of another type than the common one (a
``Mapping`` that is not a ``dict``, an ``IntEnum`` in an integer field, a ``memoryview``), a
number out of its field's range, a tagged field given in the answer, a kind of field it does not
cover.  The caller then encodes the same answer with the generated Python encoder, which the
program follows (the bytes of a missing or ``None`` field are the ones it writes, computed by
kio's writers once per field); tests/test_response_encoders.py holds the two to the same bytes.

``codes`` reads the non-zero ``error_code`` fields of an answer along a program of the paths to
them (``coordinator/control/shapes.py``, ``_code_paths``), in schema order, or answers None for
anything but dicts, lists, tuples and integers on those paths.

A program is a tuple of field entries, ``(kind, name, missing, null, a, b)``:

    INT          a: width in bytes, b: signed
    DURATION     a: width in bytes (whole milliseconds as an int)
    BOOL
    ERROR        a: the known error codes, code -> its two bytes
    STRING       a: flexible
    BYTES        a: flexible
    STRUCT       a: the struct's program, b: nullable (a marker byte 1 first)
    STRUCTS      a: the struct's program, b: flexible (an array of structs)
    ARRAY        a: the item's entry (kind, "", None, None, a, b), b: flexible
    OTHER        a field this does not write: None when the answer has a value for it
    TAGS         a: the tagged fields' names, b: the bytes of the section when none is given,
                 or None when some must be given (the last entry of a flexible struct)

``missing`` and ``null`` are the bytes of the field when the answer lacks it or gives None,
or None when the Python encoder refuses that.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

cdef enum:
    INT = 0
    DURATION = 1
    BOOL = 2
    ERROR = 3
    STRING = 4
    BYTES = 5
    STRUCT = 6
    STRUCTS = 7
    ARRAY = 8
    OTHER = 9
    TAGS = 10

KINDS = {
    "INT": INT,
    "DURATION": DURATION,
    "BOOL": BOOL,
    "ERROR": ERROR,
    "STRING": STRING,
    "BYTES": BYTES,
    "STRUCT": STRUCT,
    "STRUCTS": STRUCTS,
    "ARRAY": ARRAY,
    "OTHER": OTHER,
    "TAGS": TAGS,
}

# |ms| below this round-trips exactly through build's timedelta and kio's round(seconds * 1000)
cdef int64_t EXACT_MS = 1LL << 40

cdef struct Out:
    char *data
    Py_ssize_t len
    Py_ssize_t cap


cdef int _grow(Out *o, Py_ssize_t more) except -1:
    cdef Py_ssize_t cap = o.cap * 2
    cdef char *p
    if cap < o.len + more:
        cap = o.len + more + 64
    p = <char *>realloc(o.data, cap)
    if p == NULL:
        raise MemoryError()
    o.data = p
    o.cap = cap
    return 0


cdef inline int _put(Out *o, const char *src, Py_ssize_t n) except -1:
    if o.len + n > o.cap:
        _grow(o, n)
    memcpy(o.data + o.len, src, n)
    o.len += n
    return 0


cdef inline int _put_bytes(Out *o, bytes b) except -1:
    return _put(o, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))


cdef inline int _put_int(Out *o, int64_t v, int width) except -1:
    """``v`` big-endian in ``width`` bytes (two's complement)."""
    cdef int i
    if o.len + width > o.cap:
        _grow(o, width)
    for i in range(width):
        o.data[o.len + width - 1 - i] = <char>(v & 0xFF)
        v >>= 8
    o.len += width
    return 0


cdef inline int _put_uvarint(Out *o, int64_t v) except -1:
    cdef unsigned long long u = <unsigned long long>v
    if o.len + 10 > o.cap:
        _grow(o, 10)
    while u >= 0x80:
        o.data[o.len] = <char>((u & 0x7F) | 0x80)
        o.len += 1
        u >>= 7
    o.data[o.len] = <char>u
    o.len += 1
    return 0


cdef inline int _length(Out *o, Py_ssize_t n, bint flexible) except -1:
    if flexible:
        return _put_uvarint(o, n + 1)
    return _put_int(o, n, 4)


cdef inline bint _fits(int64_t v, int width, bint signed) noexcept:
    if signed:
        if width == 8:
            return True
        return -(1LL << (8 * width - 1)) <= v < (1LL << (8 * width - 1))
    if width == 8:
        return v >= 0  # above 2**63 - 1 is declined before this (overflow)
    return 0 <= v < (1LL << (8 * width))


cdef inline bint _exact_int(object v, int64_t *out) noexcept:
    """An exact ``int`` within 64 bits into ``out``."""
    cdef int overflow = 0
    cdef long long x
    if type(v) is not int:
        return False
    x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow:
        return False
    out[0] = x
    return True


cdef int _value(Out *o, int kind, object v, object a, object b) except -1:
    """Write non-None ``v`` of a primitive kind; 1: declined."""
    cdef int64_t x
    cdef Py_ssize_t n
    cdef const char *s
    cdef PyObject *code
    if kind == INT:
        if not _exact_int(v, &x) or not _fits(x, <int>a, <bint>b):
            return 1
        return _put_int(o, x, <int>a)
    if kind == DURATION:
        if not _exact_int(v, &x) or not (-EXACT_MS < x < EXACT_MS) or not _fits(x, <int>a, True):
            return 1
        return _put_int(o, x, <int>a)
    if kind == BOOL:
        if v is True:
            return _put(o, b"\x01", 1)
        if v is False:
            return _put(o, b"\x00", 1)
        if type(v) is int:
            return _put(o, b"\x01" if v != 0 else b"\x00", 1)
        return 1
    if kind == ERROR:
        if type(v) is not int and not isinstance(v, int):
            return 1
        code = PyDict_GetItem(<dict>a, v)
        if code == NULL:
            return 1
        return _put_bytes(o, <bytes>code)
    if kind == STRING:
        if type(v) is not str:
            return 1
        try:
            s = PyUnicode_AsUTF8AndSize(v, &n)
        except UnicodeError:
            return 1
        if a:
            _put_uvarint(o, n + 1)
        else:
            if n > 0x7FFF:
                return 1
            _put_int(o, n, 2)
        return _put(o, s, n)
    if kind == BYTES:
        if type(v) is bytes:
            s = PyBytes_AS_STRING(v)
            n = PyBytes_GET_SIZE(v)
        elif type(v) is bytearray:
            s = PyByteArray_AS_STRING(v)
            n = PyByteArray_GET_SIZE(v)
        else:
            return 1
        if a:
            _put_uvarint(o, n + 1)
        else:
            _put_int(o, n, 4)
        return _put(o, s, n)
    return 1


cdef int _struct(Out *o, object d, tuple prog) except -1:
    """Write the struct ``d`` along ``prog``; 1: declined."""
    cdef tuple entry, item
    cdef int kind
    cdef PyObject *found
    cdef object v, x, a, b
    cdef Py_ssize_t i, n
    if type(d) is not dict:
        return 1
    for entry in prog:
        kind = entry[0]
        if kind == TAGS:
            for name in <tuple>entry[4]:
                if PyDict_GetItem(<dict>d, name) != NULL:
                    return 1  # a tagged field given: the Python encoder writes it
            if entry[5] is None:
                return 1
            _put_bytes(o, <bytes>entry[5])
            continue
        found = PyDict_GetItem(<dict>d, entry[1])
        if found == NULL:
            if entry[2] is None:
                return 1
            _put_bytes(o, <bytes>entry[2])
            continue
        v = <object>found
        if v is None:
            if entry[3] is None:
                return 1
            _put_bytes(o, <bytes>entry[3])
            continue
        a = entry[4]
        b = entry[5]
        if kind == STRUCT:
            if type(v) is not dict:
                return 1
            if b:
                _put(o, b"\x01", 1)
            if _struct(o, v, <tuple>a):
                return 1
        elif kind == STRUCTS:
            if type(v) is not list and type(v) is not tuple:
                return 1
            n = len(v)
            _length(o, n, <bint>b)
            for i in range(n):
                if _struct(o, v[i], <tuple>a):
                    return 1
        elif kind == ARRAY:
            if type(v) is not list and type(v) is not tuple:
                return 1
            item = <tuple>a
            n = len(v)
            _length(o, n, <bint>b)
            for i in range(n):
                x = v[i]
                if x is None or _value(o, item[0], x, item[4], item[5]):
                    return 1
        elif kind == OTHER:
            return 1
        elif _value(o, kind, v, a, b):
            return 1
    return 0


def encode(tuple program, object answer):
    """The body of ``answer`` laid out along ``program``, or None (see the module's text)."""
    cdef Out o
    o.data = <char *>malloc(256)
    if o.data == NULL:
        raise MemoryError()
    o.len = 0
    o.cap = 256
    try:
        if _struct(&o, answer, program):
            return None
        return PyBytes_FromStringAndSize(o.data, o.len)
    finally:
        free(o.data)


cdef int _codes(object d, tuple paths, list out) except -1:
    """Append the non-zero codes along ``paths``; 1: declined."""
    cdef tuple path
    cdef PyObject *found
    cdef object v, sub
    cdef int64_t x
    cdef Py_ssize_t i
    if type(d) is not dict:
        return 1
    for path in paths:
        found = PyDict_GetItem(<dict>d, path[0])
        if found == NULL:
            continue
        v = <object>found
        if v is None:
            continue
        sub = path[1]
        if sub is None:
            if not isinstance(v, int):
                return 1
            if v != 0:
                out.append(int(v))
        elif type(v) is list or type(v) is tuple:
            for i in range(len(v)):
                if _codes(v[i], <tuple>sub, out):
                    return 1
        elif _codes(v, <tuple>sub, out):
            return 1
    return 0


def codes(tuple paths, object answer):
    """The non-zero error codes of ``answer`` along ``paths`` (``(name, nested paths or None)``
    per field), as a tuple, or None (see the module's text)."""
    cdef list out = []
    if _codes(answer, paths, out):
        return None
    return tuple(out)
