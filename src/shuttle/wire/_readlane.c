/* The read lane in C: shuttle/wire/readlane.py's five functions, the same answers.
 *
 * readlane.py is the reference and says what each function takes and returns; this
 * file only does it without building msgpack objects. It is built with the compiled
 * modules (scripts/build_compiled.py) and used when they are (shuttle/compiled.py);
 * tests/unit/wire/test_readlane.py checks it against the reference and the codec.
 *
 * Frame: "SH", kind, flags, header_len (u32 BE), payload_len (u32 BE), msgpack
 * header, payload (shuttle/wire/frames.py). Any input the lane does not take gives
 * None, never an exception: the caller then goes the general path.
 *
 * Hostile input (the parser sees every chunk a peer sends, docs/security.md, "The C
 * extensions under hostile input"): every length read from the frame is compared with
 * the bytes left before any byte it describes is read (a Cursor never passes its end);
 * the prefix's u32 lengths are held in a 64-bit Py_ssize_t, so their sums cannot
 * overflow (x86-64 Linux is what Shuttle builds for); nothing recurses; the key is
 * copied out before the answer is returned. Packers size a frame with the functions
 * its writers follow (int_size/write_int, str_size/write_str).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#define PREFIX_BYTES 12
#define KIND_REQUEST 3
#define KIND_RESPONSE 4

/* ---- reading msgpack ----------------------------------------------------------- */

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} Cursor;

static inline uint32_t be16(const unsigned char *b) { return ((uint32_t)b[0] << 8) | b[1]; }

static inline uint32_t be32(const unsigned char *b) {
    return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}

static inline uint64_t be64(const unsigned char *b) {
    return ((uint64_t)be32(b) << 32) | be32(b + 4);
}

/* An integer of any msgpack width that fits in int64; 0 for anything else. */
static int read_int(Cursor *c, int64_t *out) {
    if (c->p >= c->end) return 0;
    unsigned char b = *c->p++;
    if (b <= 0x7f) { *out = b; return 1; }
    if (b >= 0xe0) { *out = (int8_t)b; return 1; }
    Py_ssize_t need;
    switch (b) {
        case 0xcc: case 0xd0: need = 1; break;
        case 0xcd: case 0xd1: need = 2; break;
        case 0xce: case 0xd2: need = 4; break;
        case 0xcf: case 0xd3: need = 8; break;
        default: return 0;
    }
    if (c->end - c->p < need) return 0;
    const unsigned char *q = c->p;
    c->p += need;
    switch (b) {
        case 0xcc: *out = q[0]; return 1;
        case 0xcd: *out = be16(q); return 1;
        case 0xce: *out = be32(q); return 1;
        case 0xcf: {
            uint64_t v = be64(q);
            if (v > (uint64_t)INT64_MAX) return 0;
            *out = (int64_t)v;
            return 1;
        }
        case 0xd0: *out = (int8_t)q[0]; return 1;
        case 0xd1: *out = (int16_t)be16(q); return 1;
        case 0xd2: *out = (int32_t)be32(q); return 1;
        default: *out = (int64_t)be64(q); return 1;
    }
}

/* A str (fixstr, str 8/16/32): its UTF-8 bytes in place; 0 for anything else. */
static int read_str(Cursor *c, const char **s, Py_ssize_t *n) {
    if (c->p >= c->end) return 0;
    unsigned char b = *c->p++;
    Py_ssize_t len, avail;
    if ((b & 0xe0) == 0xa0) {
        len = b & 0x1f;
    } else if (b == 0xd9) {
        if (c->end - c->p < 1) return 0;
        len = c->p[0];
        c->p += 1;
    } else if (b == 0xda) {
        if (c->end - c->p < 2) return 0;
        len = be16(c->p);
        c->p += 2;
    } else if (b == 0xdb) {
        if (c->end - c->p < 4) return 0;
        len = be32(c->p);
        c->p += 4;
    } else {
        return 0;
    }
    avail = c->end - c->p;
    if (len > avail) return 0;
    *s = (const char *)c->p;
    *n = len;
    c->p += len;
    return 1;
}

/* The length of an array (fix, 16, 32) or, with map set, of a map; -1 if not one. */
static Py_ssize_t read_container(Cursor *c, int map) {
    if (c->p >= c->end) return -1;
    unsigned char b = *c->p++;
    unsigned char fix = map ? 0x80 : 0x90, b16 = map ? 0xde : 0xdc, b32 = map ? 0xdf : 0xdd;
    if ((b & 0xf0) == fix) return b & 0x0f;
    if (b == b16) {
        if (c->end - c->p < 2) return -1;
        Py_ssize_t n = be16(c->p);
        c->p += 2;
        return n;
    }
    if (b == b32) {
        if (c->end - c->p < 4) return -1;
        Py_ssize_t n = be32(c->p);
        c->p += 4;
        return n;
    }
    return -1;
}

static int prefix_ok(const unsigned char *buf, Py_ssize_t n, int kind) {
    return n >= PREFIX_BYTES && buf[0] == 'S' && buf[1] == 'H' && buf[2] == kind && buf[3] == 0;
}

/* ---- writing msgpack ----------------------------------------------------------- */

/* Bytes msgpack-python's Packer writes for an int64 (its smallest form). */
static Py_ssize_t int_size(int64_t v) {
    if (v >= 0) {
        if (v < 128) return 1;
        if (v < 256) return 2;
        if (v < 65536) return 3;
        if (v <= 0xffffffffLL) return 5;
        return 9;
    }
    if (v >= -32) return 1;
    if (v >= -128) return 2;
    if (v >= -32768) return 3;
    if (v >= -2147483648LL) return 5;
    return 9;
}

static inline unsigned char *put_be(unsigned char *p, uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xff);
        v >>= 8;
    }
    return p + bytes;
}

static unsigned char *write_int(unsigned char *p, int64_t v) {
    if (v >= 0) {
        if (v < 128) { *p++ = (unsigned char)v; return p; }
        if (v < 256) { *p++ = 0xcc; return put_be(p, (uint64_t)v, 1); }
        if (v < 65536) { *p++ = 0xcd; return put_be(p, (uint64_t)v, 2); }
        if (v <= 0xffffffffLL) { *p++ = 0xce; return put_be(p, (uint64_t)v, 4); }
        *p++ = 0xcf;
        return put_be(p, (uint64_t)v, 8);
    }
    if (v >= -32) { *p++ = (unsigned char)(v & 0xff); return p; }
    if (v >= -128) { *p++ = 0xd0; return put_be(p, (uint64_t)v, 1); }
    if (v >= -32768) { *p++ = 0xd1; return put_be(p, (uint64_t)v, 2); }
    if (v >= -2147483648LL) { *p++ = 0xd2; return put_be(p, (uint64_t)v, 4); }
    *p++ = 0xd3;
    return put_be(p, (uint64_t)v, 8);
}

static Py_ssize_t str_size(Py_ssize_t n) {
    if (n < 32) return 1 + n;
    if (n < 256) return 2 + n;
    if (n < 65536) return 3 + n;
    return 5 + n;
}

static unsigned char *write_str(unsigned char *p, const char *s, Py_ssize_t n) {
    if (n < 32) {
        *p++ = (unsigned char)(0xa0 | n);
    } else if (n < 256) {
        *p++ = 0xd9;
        p = put_be(p, (uint64_t)n, 1);
    } else if (n < 65536) {
        *p++ = 0xda;
        p = put_be(p, (uint64_t)n, 2);
    } else {
        *p++ = 0xdb;
        p = put_be(p, (uint64_t)n, 4);
    }
    memcpy(p, s, (size_t)n);
    return p + n;
}

static unsigned char *write_prefix(unsigned char *p, int kind, Py_ssize_t hlen, Py_ssize_t plen) {
    *p++ = 'S';
    *p++ = 'H';
    *p++ = (unsigned char)kind;
    *p++ = 0;
    p = put_be(p, (uint64_t)hlen, 4);
    return put_be(p, (uint64_t)plen, 4);
}

/* An exact int that fits in int64, or 0 (with no exception left set). */
static int as_int64(PyObject *o, int64_t *out) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

/* ---- the four functions -------------------------------------------------------- */

enum { ARG_KEY, ARG_OFFSET, ARG_LENGTH, ARG_VERSION, ARG_DIRECT, ARG_COUNT };

static int arg_index(const char *s, Py_ssize_t n) {
    if (n == 3 && memcmp(s, "key", 3) == 0) return ARG_KEY;
    if (n == 6 && memcmp(s, "offset", 6) == 0) return ARG_OFFSET;
    if (n == 6 && memcmp(s, "length", 6) == 0) return ARG_LENGTH;
    if (n == 16 && memcmp(s, "expected_version", 16) == 0) return ARG_VERSION;
    if (n == 6 && memcmp(s, "direct", 6) == 0) return ARG_DIRECT;
    return -1;
}

/* A msgpack bool: 1 (with *out set) for false or true, 0 for anything else. */
static int read_bool(Cursor *c, int64_t *out) {
    if (c->p >= c->end || (*c->p != 0xc2 && *c->p != 0xc3)) return 0;
    *out = *c->p++ == 0xc3;
    return 1;
}

/* The key of the last read parsed, when it was ASCII and at most LAST_KEY_BYTES_MAX
 * bytes: the next read of the same key (the usual case: a client reads the pages of
 * one object) gets this str again rather than a new one. Equal bytes are the same
 * str (an ASCII str's UTF-8 is its data), and the str already holds its hash, which
 * the store's look-ups by key (its stripe memo, attributes, block cache) then do not
 * compute again; one memcmp against a decode, an allocation, a hash and a free. A str
 * is immutable, so sharing it is safe; it is only read and replaced under the GIL. */
#define LAST_KEY_BYTES_MAX 256
static PyObject *last_key = NULL;

static PyObject *last_key_or_new(const char *key, Py_ssize_t key_n) {
    PyObject *cached = last_key;
    if (cached != NULL && PyUnicode_GET_LENGTH(cached) == key_n &&
        memcmp(PyUnicode_DATA(cached), key, (size_t)key_n) == 0)
        return Py_NewRef(cached);
    PyObject *fresh = PyUnicode_DecodeUTF8(key, key_n, NULL);
    if (fresh != NULL && key_n <= LAST_KEY_BYTES_MAX && PyUnicode_IS_ASCII(fresh))
        Py_XSETREF(last_key, Py_NewRef(fresh));
    return fresh;
}

static PyObject *parse_read_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "parse_read_request(data, header_max)");
        return NULL;
    }
    PyObject *data = args[0];
    Py_ssize_t header_max = PyLong_AsSsize_t(args[1]);
    if (header_max == -1 && PyErr_Occurred()) return NULL;
    if (!PyBytes_CheckExact(data)) Py_RETURN_NONE;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (!prefix_ok(buf, n, KIND_REQUEST)) Py_RETURN_NONE;
    uint32_t hlen = be32(buf + 4), plen = be32(buf + 8);
    if (plen != 0 || (Py_ssize_t)hlen > header_max || PREFIX_BYTES + (Py_ssize_t)hlen != n)
        Py_RETURN_NONE;
    Cursor c = {buf + PREFIX_BYTES, buf + n};
    int64_t rid, ints[ARG_COUNT] = {0, 0, 0, 0, 0};
    const char *s = NULL, *key = NULL;
    Py_ssize_t sn = 0, key_n = 0, pairs;
    int seen[ARG_COUNT] = {0, 0, 0, 0, 0};
    if (read_container(&c, 0) != 3 || !read_int(&c, &rid) || rid <= 0) Py_RETURN_NONE;
    if (!read_str(&c, &s, &sn) || sn != 4 || memcmp(s, "read", 4) != 0) Py_RETURN_NONE;
    pairs = read_container(&c, 1);
    if (pairs < 0) Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < pairs; i++) {
        if (!read_str(&c, &s, &sn)) Py_RETURN_NONE;
        int which = arg_index(s, sn);
        if (which < 0 || seen[which]) Py_RETURN_NONE;
        seen[which] = 1;
        if (which == ARG_KEY) {
            if (!read_str(&c, &key, &key_n)) Py_RETURN_NONE;
        } else if (which == ARG_DIRECT) {
            if (!read_bool(&c, &ints[ARG_DIRECT])) Py_RETURN_NONE;
        } else if (!read_int(&c, &ints[which])) {
            Py_RETURN_NONE;
        }
    }
    if (c.p != c.end || !seen[ARG_KEY] || !seen[ARG_OFFSET] || !seen[ARG_LENGTH] ||
        ints[ARG_OFFSET] < 0 || ints[ARG_LENGTH] < 0)
        Py_RETURN_NONE;
    PyObject *key_obj = last_key_or_new(key, key_n);
    if (key_obj == NULL) {
        PyErr_Clear();  /* not valid UTF-8: the general path says so */
        Py_RETURN_NONE;
    }
    PyObject *out = PyTuple_New(6);
    if (out == NULL) {
        Py_DECREF(key_obj);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 5, Py_NewRef(ints[ARG_DIRECT] ? Py_True : Py_False));
    PyObject *items[4] = {
        PyLong_FromLongLong(rid),
        PyLong_FromLongLong(ints[ARG_OFFSET]),
        PyLong_FromLongLong(ints[ARG_LENGTH]),
        seen[ARG_VERSION] ? PyLong_FromLongLong(ints[ARG_VERSION]) : Py_NewRef(Py_None),
    };
    PyTuple_SET_ITEM(out, 1, key_obj);
    PyTuple_SET_ITEM(out, 0, items[0]);
    PyTuple_SET_ITEM(out, 2, items[1]);
    PyTuple_SET_ITEM(out, 3, items[2]);
    PyTuple_SET_ITEM(out, 4, items[3]);
    for (int i = 0; i < 4; i++) {
        if (items[i] == NULL) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* pack_read_reply(rid, data[, start, stop]): the reply carrying data[start:stop]
 * (all of data without them), copied once, straight into the frame: a node answering
 * from a cached block passes the whole block and the range, not a slice of it. */
static PyObject *pack_read_reply(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "pack_read_reply(rid, data[, start, stop])");
        return NULL;
    }
    int64_t rid;
    if (!as_int64(args[0], &rid)) {
        PyErr_SetString(PyExc_OverflowError, "pack_read_reply: rid must be a 64-bit int");
        return NULL;
    }
    PyObject *data = args[1];
    if (!PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "pack_read_reply: data must be bytes");
        return NULL;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(data), start = 0, stop = size;
    if (nargs == 4) {
        int64_t a, b;
        if (!as_int64(args[2], &a) || !as_int64(args[3], &b) || a < 0 || b < a || b > size) {
            PyErr_Format(PyExc_ValueError,
                         "pack_read_reply: start and stop must be ints with "
                         "0 <= start <= stop <= len(data) (%zd)", size);
            return NULL;
        }
        start = (Py_ssize_t)a;
        stop = (Py_ssize_t)b;
    }
    Py_ssize_t plen = stop - start;
    if ((uint64_t)plen > 0xffffffffULL) {
        PyErr_SetString(PyExc_OverflowError, "pack_read_reply: data over 4 GiB");
        return NULL;
    }
    Py_ssize_t hlen = 1 + int_size(rid) + 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, PREFIX_BYTES + hlen + plen);
    if (out == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    p = write_prefix(p, KIND_RESPONSE, hlen, plen);
    *p++ = 0x92;
    p = write_int(p, rid);
    *p++ = 0xc0;
    memcpy(p, PyBytes_AS_STRING(data) + start, (size_t)plen);
    return out;
}

static PyObject *pack_read_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "pack_read_request(rid, key, offset, length, version[, direct])");
        return NULL;
    }
    int64_t rid, offset, length, version = 0;
    int has_version = args[4] != Py_None;
    int direct = nargs == 6 && args[5] == Py_True;
    if (nargs == 6 && !PyBool_Check(args[5])) Py_RETURN_NONE;
    if (!PyUnicode_CheckExact(args[1]) || !as_int64(args[0], &rid) ||
        !as_int64(args[2], &offset) || !as_int64(args[3], &length) ||
        (has_version && !as_int64(args[4], &version)))
        Py_RETURN_NONE;
    Py_ssize_t key_n;
    const char *key = PyUnicode_AsUTF8AndSize(args[1], &key_n);
    if (key == NULL) {
        PyErr_Clear();  /* lone surrogates: the general path raises msgpack's error */
        Py_RETURN_NONE;
    }
    if ((uint64_t)key_n > 0xffffffffULL) Py_RETURN_NONE;
    Py_ssize_t hlen = 1 + int_size(rid) + 5 + 1 + 4 + str_size(key_n) + 7 + int_size(offset) +
                      7 + int_size(length);
    if (has_version) hlen += 17 + int_size(version);
    if (direct) hlen += 7 + 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, PREFIX_BYTES + hlen);
    if (out == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    p = write_prefix(p, KIND_REQUEST, hlen, 0);
    *p++ = 0x93;
    p = write_int(p, rid);
    p = write_str(p, "read", 4);
    *p++ = (unsigned char)(0x83 + has_version + direct);
    p = write_str(p, "key", 3);
    p = write_str(p, key, key_n);
    p = write_str(p, "offset", 6);
    p = write_int(p, offset);
    p = write_str(p, "length", 6);
    p = write_int(p, length);
    if (has_version) {
        p = write_str(p, "expected_version", 16);
        p = write_int(p, version);
    }
    if (direct) {
        p = write_str(p, "direct", 6);
        *p++ = 0xc3;
    }
    return out;
}

static PyObject *parse_read_reply(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "parse_read_reply(data, rid, payload_max)");
        return NULL;
    }
    PyObject *data = args[0];
    Py_ssize_t payload_max = PyLong_AsSsize_t(args[2]);
    if (payload_max == -1 && PyErr_Occurred()) return NULL;
    int64_t rid, got;
    if (!as_int64(args[1], &rid) || !PyBytes_CheckExact(data)) Py_RETURN_NONE;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (!prefix_ok(buf, n, KIND_RESPONSE)) Py_RETURN_NONE;
    Py_ssize_t hlen = be32(buf + 4), plen = be32(buf + 8);
    if (plen > payload_max || PREFIX_BYTES + hlen + plen != n) Py_RETURN_NONE;
    Cursor c = {buf + PREFIX_BYTES, buf + PREFIX_BYTES + hlen};
    if (read_container(&c, 0) != 2 || !read_int(&c, &got) || got != rid) Py_RETURN_NONE;
    if (c.p >= c.end || *c.p++ != 0xc0 || c.p != c.end) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)c.end, plen);
}

/* recv_read_reply(fd, rid, length, payload_max): the client's receive of read rid's
 * reply on a plain socket, its payload read straight into the bytes object returned
 * (no copy out of a frame): one readv of the prefix and header [rid, nil] (their size
 * known from rid) into a buffer and of up to length bytes into the payload. The
 * payload (bytes) when what arrived is exactly that RESPONSE frame with at most
 * min(length, payload_max) bytes; else what arrived, as a bytearray (empty at the end
 * of the stream), for the general path. OSError as os.read raises it. */
static PyObject *recv_read_reply(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "recv_read_reply(fd, rid, length, payload_max)");
        return NULL;
    }
    int64_t fd, rid, length, payload_max;
    if (!as_int64(args[0], &fd) || fd < 0 || fd > INT_MAX || !as_int64(args[1], &rid) ||
        rid <= 0 || !as_int64(args[2], &length) || length < 0 || length > 0xffffffffLL ||
        !as_int64(args[3], &payload_max)) {
        PyErr_SetString(PyExc_ValueError,
                        "recv_read_reply: fd, rid, length and payload_max must be ints, "
                        "fd >= 0, rid > 0, 0 <= length < 4 GiB");
        return NULL;
    }
    unsigned char want[PREFIX_BYTES + 11], head[PREFIX_BYTES + 11];
    Py_ssize_t hlen = 1 + int_size(rid) + 1;
    unsigned char *w = write_prefix(want, KIND_RESPONSE, hlen, 0);
    *w++ = 0x92;
    w = write_int(w, rid);
    *w++ = 0xc0;
    Py_ssize_t head_n = PREFIX_BYTES + hlen;
    PyObject *payload = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (payload == NULL) return NULL;
    struct iovec iov[2] = {{head, (size_t)head_n}, {PyBytes_AS_STRING(payload), (size_t)length}};
    ssize_t n;
    int err;
    do {  /* as os.read: retried on EINTR unless a signal handler raised */
        Py_BEGIN_ALLOW_THREADS
        n = readv((int)fd, iov, 2);
        err = errno;
        Py_END_ALLOW_THREADS
    } while (n < 0 && err == EINTR && PyErr_CheckSignals() == 0);
    if (n < 0) {
        Py_DECREF(payload);
        if (!PyErr_Occurred()) {
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
        }
        return NULL;
    }
    if (n >= head_n && memcmp(head, want, 8) == 0 &&
        memcmp(head + PREFIX_BYTES, want + PREFIX_BYTES, (size_t)hlen) == 0) {
        Py_ssize_t plen = be32(head + 8);
        if (plen <= length && plen <= payload_max && n - head_n == plen) {
            if (plen < length && _PyBytes_Resize(&payload, plen) < 0) return NULL;
            return payload;
        }
    }
    /* Not the lane's: the bytes that arrived, in order. */
    PyObject *raw = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (raw != NULL) {
        char *r = PyByteArray_AS_STRING(raw);
        Py_ssize_t in_head = n < head_n ? (Py_ssize_t)n : head_n;
        memcpy(r, head, (size_t)in_head);
        memcpy(r + in_head, PyBytes_AS_STRING(payload), (size_t)(n - in_head));
    }
    Py_DECREF(payload);
    return raw;
}

static PyMethodDef methods[] = {
    {"parse_read_request", (PyCFunction)(void (*)(void))parse_read_request, METH_FASTCALL,
     "(rid, key, offset, length, version, direct) of one whole read request frame, or None."},
    {"pack_read_reply", (PyCFunction)(void (*)(void))pack_read_reply, METH_FASTCALL,
     "The RESPONSE frame [rid, nil] carrying data (or data[start:stop]), as bytes."},
    {"pack_read_request", (PyCFunction)(void (*)(void))pack_read_request, METH_FASTCALL,
     "The REQUEST frame of a read, or None when the general path must encode it."},
    {"parse_read_reply", (PyCFunction)(void (*)(void))parse_read_reply, METH_FASTCALL,
     "The payload of one whole RESPONSE frame [rid, nil], or None."},
    {"recv_read_reply", (PyCFunction)(void (*)(void))recv_read_reply, METH_FASTCALL,
     "Read rid's reply from fd: its payload (bytes), or what arrived (a bytearray)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "shuttle.wire._readlane",
    "The read lane in C (the reference is shuttle/wire/readlane.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__readlane(void) { return PyModule_Create(&module); }
