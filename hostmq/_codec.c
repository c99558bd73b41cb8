/* hostmq._codec: the V1 record codec in C, a fast path that mirrors the pure-Python reference.
 *
 * Every function here has a reference in hostmq/records.py (``py_encode_record``, ``py_check_record``,
 * ``py_check_stored_record``, ``py_record_fields``, ``py_java_string_hash``, ``py_cq_entries``,
 * ``py_cq_entry``) or hostmq/record_check.py (``py_single_record``) — the codec's spec, on its own
 * layer (L0, tests/test_layers.py) — and gives the same result, or
 * raises the same exception type with the same message, for every input: tests/test_codec_native.py
 * compares them byte for byte with hypothesis, hostile input included. records.py binds its public
 * names to these functions when this module imports.
 *
 * The layout (field offsets and widths, magic codes, sizes) is records.py's (MSG_HEADER_DTYPE,
 * CQ_ENTRY, ... gathered in NATIVE_LAYOUT), included from include/record_layout.h, which
 * tools/gen_layout.py generates from it (tests/test_codec_layout.py fails when the committed header
 * is stale). The _Static_asserts below check at compile time that it is the layout this code was
 * written for (the widths it reads); records.py checks at import, with a raise that ``python -O``
 * keeps, that LAYOUT (built from the same header) equals what it declares, so a stale build is
 * refused.
 *
 * What is not the usual case is handed to the reference rather than re-implemented: an argument
 * list the fast path does not parse (a missing or unknown keyword), a value that is not an integer or
 * does not fit its field, a buffer that is not a one-dimensional byte buffer, a str that is not a str.
 * The reference then gives the exact exception (TypeError, struct.error, ValidationError). Those
 * references are registered by records.py / record_check.py through ``_bind``; so are the exception
 * classes, ``records.check_properties`` (called for properties the C pre-check does not pass
 * outright) and the reserved property names. All of it lives in the module's state (CodecState), not
 * in C globals: the module is initialised in phases (PEP 489) and each module object — one per
 * interpreter — holds its own classes and callbacks.
 *
 * Reads never leave the buffer: every length is checked against the room left before it is used,
 * and positions are 64-bit after the arguments were clamped (a position past the buffer is
 * "truncated", a negative one is refused before any read).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

/* --- layout (generated from records.py: MSG_HEADER_DTYPE, CQ_ENTRY, ...) ---------------------- */
#include "include/record_layout.h"
#include "include/record_check.h"
#include "include/crc32_fast.h"

#define CRC_WITHOUT_GIL_BYTES (5 * 1024)     /* zlib.crc32 releases the GIL from this size too */

/* What the code below reads and writes, as the generated layout must give it: a header that changes
 * in a way this code does not follow fails the build instead of writing records readers reject. */
#define LAYOUT_HOLDS(cond) _Static_assert(cond, "hostmq/include/record_layout.h: " #cond)
LAYOUT_HOLDS(OFF_TOTAL_SIZE == 0 && W_TOTAL_SIZE == 4 && OFF_MAGIC == 4 && W_MAGIC == 4);
LAYOUT_HOLDS(W_BODY_CRC == 4 && W_QUEUE_ID == 4 && W_FLAG == 4 && W_SYS_FLAG == 4);
LAYOUT_HOLDS(W_RECONSUME_TIMES == 4 && W_BODY_LENGTH == 4);
LAYOUT_HOLDS(W_QUEUE_OFFSET == 8 && W_PHYS_OFFSET == 8 && W_BORN_TS_MS == 8 && W_STORE_TS_MS == 8);
LAYOUT_HOLDS(W_PREPARED_TX_OFFSET == 8 && (int)W_BORN_HOST == (int)HOST_BYTES && (int)W_STORE_HOST == (int)HOST_BYTES);
LAYOUT_HOLDS(HDR_BYTES == OFF_BODY_LENGTH + W_BODY_LENGTH);     /* BODYLENGTH ends the header */
LAYOUT_HOLDS(TOPIC_LEN_BYTES == 1 && PROPS_LEN_BYTES == 2);      /* a u8 and a big-endian u16 */
LAYOUT_HOLDS(MIN_RECORD_BYTES == HDR_BYTES + TOPIC_LEN_BYTES + PROPS_LEN_BYTES);
LAYOUT_HOLDS(MIN_BLANK_BYTES == W_TOTAL_SIZE + W_MAGIC);         /* TOTALSIZE and BLANK_MAGIC_CODE */
LAYOUT_HOLDS(CQ_OFF_SIZE == CQ_OFF_PHYS_OFFSET + 8 && CQ_OFF_TAG_HASH == CQ_OFF_SIZE + 4);
LAYOUT_HOLDS(CQ_ENTRY_BYTES == CQ_OFF_TAG_HASH + 8);

/* --- the module's state: what records.py / record_check.py bind (_bind), the interned names ---- */
enum { E_TOPIC, E_BODY, E_PROPS, E_QUEUE_ID, E_FLAG, E_SYS_FLAG, E_BORN_TS, E_BORN_HOST, E_STORE_TS,
       E_STORE_HOST, E_RECONSUME, E_PREPARED, E_QOFF, E_PHYS, E_CRC, E_COUNT };

typedef struct {
    PyObject *CorruptRecordError, *ValidationError;     /* ValueError until records.py binds its own */
    PyObject *check_properties;                         /* records.check_properties, NULL until bound */
    PyObject *references;                               /* dict: function name -> its Python reference */
    HmReserved reserved;                                /* the property names the broker acts on */
    /* each function's parameter names, interned (compared by identity first in parse_args) */
    PyObject *check_names[5], *fields_names[2], *encode_names[E_COUNT], *hash_names[1], *cq_names[3],
             *cq_one_names[3], *single_names[3];
} CodecState;

static inline CodecState *state_of(PyObject *module) { return (CodecState *)PyModule_GetState(module); }

static uint32_t body_crc(const unsigned char *p, Py_ssize_t n)
{
    if (n <= CRC_WITHOUT_GIL_BYTES)
        return hm_body_crc(p, (size_t)n);
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = hm_body_crc(p, (size_t)n);
    Py_END_ALLOW_THREADS
    return crc;
}

/* --- arguments -------------------------------------------------------------------------------- */
/* Fill out[0..nnames) from a vectorcall. -1 (no error set) unless each parameter is given at most
 * once, none is unknown, the first `required` are there and at most `maxpos` are positional: the
 * caller then hands the call to the reference, which raises Python's own TypeError. */
static int parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **names,
                      int nnames, int maxpos, int required, PyObject **out)
{
    if (nargs > maxpos)
        return -1;
    for (int i = 0; i < nnames; i++)
        out[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int j = 0;
        while (j < nnames && key != names[j]) j++;
        if (j == nnames) {      /* not interned alike: compare the text */
            for (j = 0; j < nnames; j++) {
                int c = PyUnicode_Compare(key, names[j]);
                if (c == -1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
                if (c == 0) break;
            }
        }
        if (j == nnames || out[j] != NULL)
            return -1;
        out[j] = args[nargs + k];
    }
    for (int i = 0; i < required; i++)
        if (out[i] == NULL)
            return -1;
    return 0;
}

/* Call the Python reference `name` with the same arguments (clearing any error of the fast path). */
static PyObject *reference(CodecState *st, const char *name, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames)
{
    PyObject *f = PyDict_GetItemString(st->references, name);   /* borrowed */
    if (f == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "hostmq._codec.%s: no Python reference bound", name);
        return NULL;
    }
    PyErr_Clear();
    Py_INCREF(f);       /* the reference may rebind the references while it runs */
    PyObject *out = PyObject_Vectorcall(f, args, nargsf, kwnames);
    Py_DECREF(f);
    return out;
}

/* An integer argument, clamped to int64 (positions: past INT64_MAX is as far as INT64_MAX). */
static int as_clamped_i64(PyObject *o, long long *out)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = overflow > 0 ? LLONG_MAX : overflow < 0 ? LLONG_MIN : v;
    return 0;
}

/* An integer argument within [lo, hi]; -1 (maybe with an error set) if not an integer or outside. */
static int as_ranged(PyObject *o, long long lo, long long hi, long long *out)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if ((v == -1 && PyErr_Occurred()) || overflow || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* A one-dimensional byte buffer (bytes, bytearray, memoryview, mmap, numpy uint8, ...). Anything
 * else (another item type, several dimensions, not contiguous) is the reference's to judge. */
static int get_bytes(PyObject *o, Py_buffer *v)
{
    if (PyObject_GetBuffer(o, v, PyBUF_ND | PyBUF_FORMAT) < 0)
        return -1;
    if (v->ndim != 1 || v->itemsize != 1 || (v->format != NULL && strcmp(v->format, "B") != 0)) {
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* --- errors ----------------------------------------------------------------------------------- */
static PyObject *raise_corrupt(CodecState *st, PyObject *pos, PyObject *why)
{
    if (why == NULL)
        return NULL;
    PyObject *e = PyObject_CallFunction(st->CorruptRecordError, "sOO", "", pos, why);
    Py_DECREF(why);
    if (e != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return NULL;
}

static PyObject *raise_validation(CodecState *st, PyObject *why)
{
    if (why == NULL)
        return NULL;
    PyErr_SetObject(st->ValidationError, why);
    Py_DECREF(why);
    return NULL;
}

/* str of an argument as an f-string shows it (format(x, "")). */
static PyObject *shown(PyObject *o)
{
    PyObject *empty = PyUnicode_FromStringAndSize(NULL, 0);
    if (empty == NULL)
        return NULL;
    PyObject *s = PyObject_Format(o, empty);
    Py_DECREF(empty);
    return s;
}

/* --- the record check (records.py_check_record): include/record_check.h, with the CRC above ---- */
static int check_core(const unsigned char *b, Py_ssize_t n, long long pos, long long limit,
                      int verify_crc, Checked *c)
{
    return hm_check_core(b, n, pos, limit, verify_crc, body_crc, c);
}

static int properties_plainly_valid(const CodecState *st, const unsigned char *p, Py_ssize_t n)
{
    return hm_reserved_plainly_valid(&st->reserved, p, n);
}

/* Arguments of check_record / check_stored_record, converted; -1: hand the call to the reference. */
typedef struct {
    Py_buffer view;
    long long pos, limit;
    int verify_crc;
} CheckArgs;

static int check_args(PyObject *buf, PyObject *pos, PyObject *limit, PyObject *verify, CheckArgs *a)
{
    if (as_clamped_i64(pos, &a->pos) < 0 || as_clamped_i64(limit, &a->limit) < 0)
        return -1;
    a->verify_crc = verify == NULL ? 1 : PyObject_IsTrue(verify);
    if (a->verify_crc < 0 || get_bytes(buf, &a->view) < 0)
        return -1;
    return 0;
}

static PyObject *negative_position(CodecState *st, PyObject *pos)
{
    PyObject *s = shown(pos);
    if (s == NULL)
        return NULL;
    PyObject *why = PyUnicode_FromFormat("negative position %U", s);
    Py_DECREF(s);
    return raise_corrupt(st, pos, why);
}

static PyObject *codec_check_record(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                                    PyObject *kwnames)
{
    CodecState *st = state_of(self);
    PyObject *v[4];
    CheckArgs a;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *names[4] = {st->check_names[0], st->check_names[1], st->check_names[2], st->check_names[4]};
    if (parse_args(args, nargs, kwnames, names, 4, 4, 3, v) < 0 || check_args(v[0], v[1], v[2], v[3], &a) < 0)
        return reference(st, "check_record", args, (size_t)nargsf, kwnames);
    if (a.pos < 0) {
        PyBuffer_Release(&a.view);
        return negative_position(st, v[1]);
    }
    Checked c;
    int bad = check_core(a.view.buf, a.view.len, a.pos, a.limit, a.verify_crc, &c);
    PyBuffer_Release(&a.view);
    if (bad)
        return raise_corrupt(st, v[1], PyUnicode_FromString(c.why));
    return Py_BuildValue("(ii)", c.kind, (int)c.total);
}

static PyObject *codec_check_stored_record(PyObject *self, PyObject *const *args,
                                           Py_ssize_t nargsf, PyObject *kwnames)
{
    CodecState *st = state_of(self);
    PyObject *v[5];
    CheckArgs a;
    long long phys;
    int phys_beyond;    /* the argument is outside int64: no stored PHYSICALOFFSET equals it */
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (parse_args(args, nargs, kwnames, st->check_names, 5, 5, 4, v) < 0)
        return reference(st, "check_stored_record", args, (size_t)nargsf, kwnames);
    phys = PyLong_AsLongLongAndOverflow(v[3], &phys_beyond);
    if ((phys == -1 && PyErr_Occurred()) || check_args(v[0], v[1], v[2], v[4], &a) < 0)
        return reference(st, "check_stored_record", args, (size_t)nargsf, kwnames);
    if (a.pos < 0) {
        PyBuffer_Release(&a.view);
        return negative_position(st, v[1]);
    }
    Checked c;
    const unsigned char *r = (const unsigned char *)a.view.buf + a.pos;
    if (check_core(a.view.buf, a.view.len, a.pos, a.limit, a.verify_crc, &c)) {
        PyBuffer_Release(&a.view);
        return raise_corrupt(st, v[1], PyUnicode_FromString(c.why));
    }
    if (c.kind == KIND_MESSAGE) {
        int32_t queue_id = (int32_t)be32(r + OFF_QUEUE_ID);
        int64_t queue_offset = (int64_t)be64(r + OFF_QUEUE_OFFSET), stored_phys = (int64_t)be64(r + OFF_PHYS_OFFSET);
        PyBuffer_Release(&a.view);
        if (phys_beyond || stored_phys != phys) {
            PyObject *s = shown(v[3]);
            if (s == NULL)
                return NULL;
            PyObject *why = PyUnicode_FromFormat("PHYSICALOFFSET %lld is not the record's position %U",
                                                 (long long)stored_phys, s);
            Py_DECREF(s);
            return raise_corrupt(st, v[1], why);
        }
        if (queue_id < 0 || queue_offset < 0)
            return raise_corrupt(st, v[1], PyUnicode_FromFormat("impossible queue id %d or queue offset %lld",
                                                            (int)queue_id, (long long)queue_offset));
    } else {
        PyBuffer_Release(&a.view);
    }
    return Py_BuildValue("(ii)", c.kind, (int)c.total);
}

/* --- record_fields (records.py_record_fields) ------------------------------------------------- */
static PyObject *codec_record_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                                     PyObject *kwnames)
{
    CodecState *st = state_of(self);
    PyObject *v[2];
    Py_buffer view;
    long long pos;
    if (parse_args(args, PyVectorcall_NARGS(nargsf), kwnames, st->fields_names, 2, 2, 2, v) < 0 ||
        as_clamped_i64(v[1], &pos) < 0 || get_bytes(v[0], &view) < 0)
        return reference(st, "record_fields", args, (size_t)nargsf, kwnames);
    const unsigned char *b = view.buf;
    long long n = view.len;
    const char *why = NULL;
    int32_t body_len = 0;
    long long tpos = 0, ppos = 0;
    uint16_t props_len = 0;
    if (pos < 0 || pos > n || n - pos < HDR_BYTES) {
        why = "record header lies outside the buffer";
    } else {
        body_len = (int32_t)be32(b + pos + OFF_BODY_LENGTH);
        tpos = pos + HDR_BYTES + (long long)body_len;
        if (body_len < 0 || tpos + TOPIC_LEN_BYTES > n) {
            why = "body lies outside the buffer";
        } else {
            ppos = tpos + TOPIC_LEN_BYTES + b[tpos];
            if (ppos + PROPS_LEN_BYTES > n) {
                why = "topic lies outside the buffer";
            } else {
                props_len = be16(b + ppos);
                if (ppos + PROPS_LEN_BYTES + props_len > n)
                    why = "properties lie outside the buffer";
            }
        }
    }
    if (why != NULL) {
        PyBuffer_Release(&view);
        return raise_corrupt(st, v[1], PyUnicode_FromString(why));
    }
    const unsigned char *r = b + pos;
    PyObject *t = Py_BuildValue(
        "(iIIiiLLiLy#Ly#iLiLiy#Li)",
        (int)(int32_t)be32(r + OFF_TOTAL_SIZE), (unsigned)be32(r + OFF_MAGIC), (unsigned)be32(r + OFF_BODY_CRC),
        (int)(int32_t)be32(r + OFF_QUEUE_ID), (int)(int32_t)be32(r + OFF_FLAG),
        (long long)(int64_t)be64(r + OFF_QUEUE_OFFSET), (long long)(int64_t)be64(r + OFF_PHYS_OFFSET),
        (int)(int32_t)be32(r + OFF_SYS_FLAG), (long long)(int64_t)be64(r + OFF_BORN_TS_MS),
        (const char *)r + OFF_BORN_HOST, (Py_ssize_t)HOST_BYTES,
        (long long)(int64_t)be64(r + OFF_STORE_TS_MS), (const char *)r + OFF_STORE_HOST, (Py_ssize_t)HOST_BYTES,
        (int)(int32_t)be32(r + OFF_RECONSUME_TIMES), (long long)(int64_t)be64(r + OFF_PREPARED_TX_OFFSET),
        (int)body_len,
        pos + HDR_BYTES, (int)body_len,
        (const char *)b + tpos + TOPIC_LEN_BYTES, (Py_ssize_t)(ppos - tpos - TOPIC_LEN_BYTES),
        ppos + PROPS_LEN_BYTES, (int)props_len);
    PyBuffer_Release(&view);
    return t;
}

/* --- encode_record (records.py_encode_record) ------------------------------------------------- */
/* bytes or bytearray (what struct's "s" takes), exported so the GIL may be dropped while reading. */
static int get_packable(PyObject *o, Py_buffer *v)
{
    if (!PyBytes_Check(o) && !PyByteArray_Check(o))
        return -1;
    return PyObject_GetBuffer(o, v, PyBUF_SIMPLE);
}

static PyObject *codec_encode_record(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                                     PyObject *kwnames)
{
    CodecState *st = state_of(self);
    PyObject *v[E_COUNT];
    long long ints[E_COUNT];
    static const long long lo[E_COUNT] = {
        [E_QUEUE_ID] = INT32_MIN, [E_FLAG] = INT32_MIN, [E_SYS_FLAG] = INT32_MIN, [E_BORN_TS] = LLONG_MIN,
        [E_STORE_TS] = LLONG_MIN, [E_RECONSUME] = INT32_MIN, [E_PREPARED] = LLONG_MIN, [E_QOFF] = LLONG_MIN,
        [E_PHYS] = LLONG_MIN, [E_CRC] = 0};
    static const long long hi[E_COUNT] = {
        [E_QUEUE_ID] = INT32_MAX, [E_FLAG] = INT32_MAX, [E_SYS_FLAG] = INT32_MAX, [E_BORN_TS] = LLONG_MAX,
        [E_STORE_TS] = LLONG_MAX, [E_RECONSUME] = INT32_MAX, [E_PREPARED] = LLONG_MAX, [E_QOFF] = LLONG_MAX,
        [E_PHYS] = LLONG_MAX, [E_CRC] = UINT32_MAX};
    Py_buffer bufs[E_COUNT];
    static const int packed[] = {E_TOPIC, E_BODY, E_PROPS, E_BORN_HOST, E_STORE_HOST};
    int held = 0;
    PyObject *out = NULL;

    if (parse_args(args, PyVectorcall_NARGS(nargsf), kwnames, st->encode_names, E_COUNT, 3, 3, v) < 0)
        goto use_reference;
    for (int i = E_QUEUE_ID; i < E_COUNT; i++) {
        ints[i] = 0;
        if (i == E_BORN_HOST || i == E_STORE_HOST || v[i] == NULL || (i == E_CRC && v[i] == Py_None))
            continue;
        if (as_ranged(v[i], lo[i], hi[i], &ints[i]) < 0)
            goto use_reference;
    }
    for (; held < (int)(sizeof packed / sizeof packed[0]); held++) {
        int i = packed[held];
        if (v[i] == NULL) {     /* a host left at its default: eight zero bytes */
            bufs[i].buf = NULL;
            bufs[i].len = 0;
            bufs[i].obj = NULL;
            continue;
        }
        if (get_packable(v[i], &bufs[i]) < 0)
            goto use_reference;
    }
    Py_ssize_t blen = bufs[E_BODY].len, tlen = bufs[E_TOPIC].len, plen = bufs[E_PROPS].len;
    long long total = (long long)HDR_BYTES + blen + TOPIC_LEN_BYTES + tlen + PROPS_LEN_BYTES + plen;
    if (tlen > 0xFF || plen > 0xFFFF || total > INT32_MAX)
        goto use_reference;     /* the reference raises ValidationError / struct.error */
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL)
        goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *body = bufs[E_BODY].buf;
    int given_crc = v[E_CRC] != NULL && v[E_CRC] != Py_None;
    uint32_t crc = (uint32_t)ints[E_CRC];
    if (blen > CRC_WITHOUT_GIL_BYTES) {     /* the body is exported: it cannot change size meanwhile */
        Py_BEGIN_ALLOW_THREADS
        if (!given_crc)
            crc = hm_body_crc(body, (size_t)blen);
        memcpy(o + HDR_BYTES, body, (size_t)blen);
        Py_END_ALLOW_THREADS
    } else {
        if (!given_crc)
            crc = hm_body_crc(body, (size_t)blen);
        if (blen)
            memcpy(o + HDR_BYTES, body, (size_t)blen);
    }
    put32(o + OFF_TOTAL_SIZE, (uint32_t)total);
    put32(o + OFF_MAGIC, MAGIC_CODE);
    put32(o + OFF_BODY_CRC, crc);
    put32(o + OFF_QUEUE_ID, (uint32_t)ints[E_QUEUE_ID]);
    put32(o + OFF_FLAG, (uint32_t)ints[E_FLAG]);
    put64(o + OFF_QUEUE_OFFSET, (uint64_t)ints[E_QOFF]);
    put64(o + OFF_PHYS_OFFSET, (uint64_t)ints[E_PHYS]);
    put32(o + OFF_SYS_FLAG, (uint32_t)ints[E_SYS_FLAG]);
    put64(o + OFF_BORN_TS_MS, (uint64_t)ints[E_BORN_TS]);
    put64(o + OFF_STORE_TS_MS, (uint64_t)ints[E_STORE_TS]);
    put32(o + OFF_RECONSUME_TIMES, (uint32_t)ints[E_RECONSUME]);
    put64(o + OFF_PREPARED_TX_OFFSET, (uint64_t)ints[E_PREPARED]);
    put32(o + OFF_BODY_LENGTH, (uint32_t)blen);
    /* struct's "8s": shorter hosts are padded with zero bytes, longer ones cut */
    static const int host_at[2][2] = {{E_BORN_HOST, OFF_BORN_HOST}, {E_STORE_HOST, OFF_STORE_HOST}};
    for (int h = 0; h < 2; h++) {
        Py_buffer *hb = &bufs[host_at[h][0]];
        size_t n = hb->len < HOST_BYTES ? (size_t)hb->len : HOST_BYTES;
        memset(o + host_at[h][1], 0, HOST_BYTES);
        if (n)
            memcpy(o + host_at[h][1], hb->buf, n);
    }
    unsigned char *t = o + HDR_BYTES + blen;
    t[0] = (unsigned char)tlen;
    if (tlen)
        memcpy(t + TOPIC_LEN_BYTES, bufs[E_TOPIC].buf, (size_t)tlen);
    put16(t + TOPIC_LEN_BYTES + tlen, (uint16_t)plen);
    if (plen)
        memcpy(t + TOPIC_LEN_BYTES + tlen + PROPS_LEN_BYTES, bufs[E_PROPS].buf, (size_t)plen);
    goto done;

use_reference:
    for (int k = 0; k < held; k++)
        if (bufs[packed[k]].obj != NULL)
            PyBuffer_Release(&bufs[packed[k]]);
    return reference(st, "encode_record", args, (size_t)nargsf, kwnames);
done:
    for (int k = 0; k < held; k++)
        if (bufs[packed[k]].obj != NULL)
            PyBuffer_Release(&bufs[packed[k]]);
    return out;
}

static int unicode_ready(PyObject *s)
{
#if PY_VERSION_HEX < 0x030C0000
    return PyUnicode_READY(s);
#else
    (void)s;
    return 0;     /* every str is ready from 3.12 on */
#endif
}

/* --- java_string_hash (records.py_java_string_hash) ------------------------------------------- */
static PyObject *codec_java_string_hash(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                                        PyObject *kwnames)
{
    CodecState *st = state_of(self);
    PyObject *v[1];
    if (parse_args(args, PyVectorcall_NARGS(nargsf), kwnames, st->hash_names, 1, 1, 1, v) < 0 ||
        !PyUnicode_Check(v[0]) || unicode_ready(v[0]) < 0)
        return reference(st, "java_string_hash", args, (size_t)nargsf, kwnames);
    PyObject *s = v[0];
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    uint32_t h = 0;
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *p = data;
        for (Py_ssize_t i = 0; i < n; i++)
            h = 31u * h + p[i];
    } else if (kind == PyUnicode_2BYTE_KIND) {      /* BMP: lone surrogates are one unit, as in Java */
        const Py_UCS2 *p = data;
        for (Py_ssize_t i = 0; i < n; i++)
            h = 31u * h + p[i];
    } else {
        const Py_UCS4 *p = data;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = p[i];
            if (c < 0x10000) {
                h = 31u * h + c;
            } else {                                /* a UTF-16 surrogate pair */
                c -= 0x10000;
                h = 31u * h + (0xD800u + (c >> 10));
                h = 31u * h + (0xDC00u + (c & 0x3FFu));
            }
        }
    }
    return PyLong_FromLong((long)(int32_t)h);
}

/* --- consume-queue entries (records.py_cq_entries, py_cq_entry) ------------------------------- */
/* A column of integers: a one-dimensional native integer buffer (numpy arrays), or a list / tuple. */
typedef struct {
    Py_buffer view;
    int is_buffer;
    char code;
    PyObject *seq;      /* list or tuple (borrowed) */
    Py_ssize_t len;
} Column;

static int open_column(PyObject *o, Column *c)
{
    c->is_buffer = 0;
    c->seq = NULL;
    if (PyList_Check(o) || PyTuple_Check(o)) {
        c->seq = o;
        c->len = PySequence_Fast_GET_SIZE(o);
        return 0;
    }
    if (!PyObject_CheckBuffer(o) || PyObject_GetBuffer(o, &c->view, PyBUF_ND | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = c->view.format ? c->view.format : "B";
    if (f[0] == '@')
        f++;
    char code = f[0];
    size_t want = 0;
    switch (code) {
    case 'b': case 'B': want = sizeof(char); break;
    case 'h': case 'H': want = sizeof(short); break;
    case 'i': case 'I': want = sizeof(int); break;
    case 'l': case 'L': want = sizeof(long); break;
    case 'q': case 'Q': want = sizeof(long long); break;
    default: break;
    }
    if (want == 0 || f[1] != '\0' || c->view.ndim != 1 || (size_t)c->view.itemsize != want) {
        PyBuffer_Release(&c->view);
        return -1;
    }
    c->is_buffer = 1;
    c->code = code;
    c->len = c->view.shape[0];
    return 0;
}

static void close_column(Column *c)
{
    if (c->is_buffer)
        PyBuffer_Release(&c->view);
}

/* Item i within [lo, hi]; -1 (maybe with an error set) otherwise. */
static int column_item(Column *c, Py_ssize_t i, long long lo, long long hi, long long *out)
{
    if (!c->is_buffer)
        return as_ranged(PySequence_Fast_GET_ITEM(c->seq, i), lo, hi, out);
    const char *p = (const char *)c->view.buf + i * c->view.itemsize;
    long long v;
    unsigned long long u;
    switch (c->code) {
    case 'b': v = *(const signed char *)p; break;
    case 'B': v = *(const unsigned char *)p; break;
    case 'h': { short x; memcpy(&x, p, sizeof x); v = x; break; }
    case 'H': { unsigned short x; memcpy(&x, p, sizeof x); v = x; break; }
    case 'i': { int x; memcpy(&x, p, sizeof x); v = x; break; }
    case 'I': { unsigned int x; memcpy(&x, p, sizeof x); v = x; break; }
    case 'l': { long x; memcpy(&x, p, sizeof x); v = x; break; }
    case 'q': { long long x; memcpy(&x, p, sizeof x); v = x; break; }
    case 'L': { unsigned long x; memcpy(&x, p, sizeof x); u = x; goto unsigned_value; }
    default: { unsigned long long x; memcpy(&x, p, sizeof x); u = x; goto unsigned_value; }
    }
    goto check;
unsigned_value:
    if (u > (unsigned long long)LLONG_MAX)
        return -1;
    v = (long long)u;
check:
    if (v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static PyObject *codec_cq_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                                  PyObject *kwnames)
{
    CodecState *st = state_of(self);
    PyObject *v[3];
    Column cols[3];
    int opened = 0;
    PyObject *out = NULL;
    if (parse_args(args, PyVectorcall_NARGS(nargsf), kwnames, st->cq_names, 3, 3, 3, v) < 0)
        goto use_reference;
    for (; opened < 3; opened++)
        if (open_column(v[opened], &cols[opened]) < 0)
            goto use_reference;
    Py_ssize_t n = cols[0].len;
    if (cols[1].len != n || cols[2].len != n)
        goto use_reference;
    out = PyBytes_FromStringAndSize(NULL, n * CQ_ENTRY_BYTES);
    if (out == NULL)
        goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++, o += CQ_ENTRY_BYTES) {
        long long phys, size, tag;
        if (column_item(&cols[0], i, LLONG_MIN, LLONG_MAX, &phys) < 0 ||
            column_item(&cols[1], i, INT32_MIN, INT32_MAX, &size) < 0 ||
            column_item(&cols[2], i, LLONG_MIN, LLONG_MAX, &tag) < 0) {
            Py_CLEAR(out);
            goto use_reference;
        }
        put64(o + CQ_OFF_PHYS_OFFSET, (uint64_t)phys);
        put32(o + CQ_OFF_SIZE, (uint32_t)size);
        put64(o + CQ_OFF_TAG_HASH, (uint64_t)tag);
    }
    goto done;
use_reference:
    for (int k = 0; k < opened; k++)
        close_column(&cols[k]);
    return reference(st, "cq_entries", args, (size_t)nargsf, kwnames);
done:
    for (int k = 0; k < opened; k++)
        close_column(&cols[k]);
    return out;
}

static PyObject *codec_cq_entry(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                                PyObject *kwnames)
{
    CodecState *st = state_of(self);
    PyObject *v[3];
    long long phys, size, tag;
    if (parse_args(args, PyVectorcall_NARGS(nargsf), kwnames, st->cq_one_names, 3, 3, 3, v) < 0 ||
        as_ranged(v[0], LLONG_MIN, LLONG_MAX, &phys) < 0 || as_ranged(v[1], INT32_MIN, INT32_MAX, &size) < 0 ||
        as_ranged(v[2], LLONG_MIN, LLONG_MAX, &tag) < 0)
        return reference(st, "cq_entry", args, (size_t)nargsf, kwnames);
    unsigned char o[CQ_ENTRY_BYTES];
    put64(o + CQ_OFF_PHYS_OFFSET, (uint64_t)phys);
    put32(o + CQ_OFF_SIZE, (uint32_t)size);
    put64(o + CQ_OFF_TAG_HASH, (uint64_t)tag);
    return PyBytes_FromStringAndSize((const char *)o, CQ_ENTRY_BYTES);
}

/* --- single_record (record_check.py_single_record) ------------------------------------------- */
/* The exception being raised, taken (normalized) out of the thread state. */
static PyObject *raised_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

static PyObject *codec_single_record(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                                     PyObject *kwnames)
{
    CodecState *st = state_of(self);
    PyObject *v[3];
    Py_buffer view;
    long long max_body, max_props;
    if (st->check_properties == NULL ||
        parse_args(args, PyVectorcall_NARGS(nargsf), kwnames, st->single_names, 3, 3, 3, v) < 0 ||
        as_clamped_i64(v[1], &max_body) < 0 || as_clamped_i64(v[2], &max_props) < 0 || get_bytes(v[0], &view) < 0)
        return reference(st, "single_record", args, (size_t)nargsf, kwnames);
    const unsigned char *b = view.buf;
    Py_ssize_t n = view.len;
    PyObject *why = NULL, *out = NULL;
    Checked c;
    if (check_core(b, n, 0, n, 1, &c)) {
        why = PyUnicode_FromFormat("record 0: %s", c.why);
        goto refuse;
    }
    if (c.kind != KIND_MESSAGE || c.total != n) {
        why = PyUnicode_FromFormat("frame of %zd bytes holds a %d-byte record and more", n, (int)c.total);
        goto refuse;
    }
    int32_t blen = (int32_t)be32(b + OFF_BODY_LENGTH);
    if (!(0 < blen && blen <= max_body)) {
        PyObject *s = shown(v[1]);
        why = s ? PyUnicode_FromFormat("record 0: body of %d bytes is empty or over %U bytes", (int)blen, s) : NULL;
        Py_XDECREF(s);
        goto refuse;
    }
    Py_ssize_t tpos = HDR_BYTES + (Py_ssize_t)blen;       /* check_core: all within the record */
    Py_ssize_t tlen = b[tpos];
    Py_ssize_t ppos = tpos + TOPIC_LEN_BYTES + tlen + PROPS_LEN_BYTES;
    Py_ssize_t plen = be16(b + ppos - PROPS_LEN_BYTES);
    if (plen > max_props) {
        PyObject *s = shown(v[2]);
        why = s ? PyUnicode_FromFormat("record 0: properties over %U bytes", s) : NULL;
        Py_XDECREF(s);
        goto refuse;
    }
    if (!properties_plainly_valid(st, b + ppos, plen)) {
        PyObject *props = PyBytes_FromStringAndSize((const char *)b + ppos, plen);
        PyObject *res = props ? PyObject_CallOneArg(st->check_properties, props) : NULL;
        Py_XDECREF(props);
        if (res == NULL) {
            if (PyErr_ExceptionMatches(st->ValidationError)) {
                PyObject *e = raised_exception();
                why = e ? PyUnicode_FromFormat("record 0: %S", e) : NULL;
                Py_XDECREF(e);
                goto refuse;
            }
            goto done;
        }
        Py_DECREF(res);
    }
    int32_t qid = (int32_t)be32(b + OFF_QUEUE_ID);
    if (qid < 0) {
        why = PyUnicode_FromFormat("negative queue id %d", (int)qid);
        goto refuse;
    }
    out = Py_BuildValue("(y#in)", (const char *)b + tpos + TOPIC_LEN_BYTES, tlen, (int)qid, n);
    goto done;
refuse:
    PyBuffer_Release(&view);
    return raise_validation(st, why);
done:
    PyBuffer_Release(&view);
    return out;
}

/* --- _bind ------------------------------------------------------------------------------------ */
static PyObject *codec_bind(PyObject *self, PyObject *args, PyObject *kwargs)
{
    CodecState *st = state_of(self);
    if (PyTuple_GET_SIZE(args) != 0 || kwargs == NULL) {
        PyErr_SetString(PyExc_TypeError, "_bind takes keyword arguments only");
        return NULL;
    }
    PyObject *key, *value;
    Py_ssize_t i = 0;
    while (PyDict_Next(kwargs, &i, &key, &value)) {
        if (PyUnicode_CompareWithASCIIString(key, "reserved_property_marks") == 0) {
            if (hm_set_reserved(&st->reserved, value) < 0)
                return NULL;
            continue;
        }
        PyObject **slot = PyUnicode_CompareWithASCIIString(key, "CorruptRecordError") == 0 ? &st->CorruptRecordError
                        : PyUnicode_CompareWithASCIIString(key, "ValidationError") == 0 ? &st->ValidationError
                        : PyUnicode_CompareWithASCIIString(key, "check_properties") == 0 ? &st->check_properties
                        : NULL;
        if (slot != NULL) {
            Py_INCREF(value);
            Py_XSETREF(*slot, value);
        } else if (PyDict_SetItem(st->references, key, value) < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* --- module ----------------------------------------------------------------------------------- */
#define FASTCALL_KW (METH_FASTCALL | METH_KEYWORDS)
static PyMethodDef methods[] = {
    {"encode_record", (PyCFunction)(void (*)(void))codec_encode_record, FASTCALL_KW,
     "records.encode_record in C: one complete V1 record."},
    {"check_record", (PyCFunction)(void (*)(void))codec_check_record, FASTCALL_KW,
     "records.check_record in C: (kind, total_size) or CorruptRecordError."},
    {"check_stored_record", (PyCFunction)(void (*)(void))codec_check_stored_record, FASTCALL_KW,
     "records.check_stored_record in C."},
    {"record_fields", (PyCFunction)(void (*)(void))codec_record_fields, FASTCALL_KW,
     "records.record_fields in C: every header field, then body start and length, topic bytes, "
     "properties start and length."},
    {"java_string_hash", (PyCFunction)(void (*)(void))codec_java_string_hash, FASTCALL_KW,
     "records.java_string_hash in C: Java String.hashCode."},
    {"cq_entries", (PyCFunction)(void (*)(void))codec_cq_entries, FASTCALL_KW,
     "records.cq_entries in C: consume-queue entries, 20 bytes each."},
    {"cq_entry", (PyCFunction)(void (*)(void))codec_cq_entry, FASTCALL_KW,
     "records.cq_entry in C: one consume-queue entry."},
    {"single_record", (PyCFunction)(void (*)(void))codec_single_record, FASTCALL_KW,
     "record_check.single_record in C: (topic bytes, queue id, size) or ValidationError."},
    {"_bind", (PyCFunction)(void (*)(void))codec_bind, METH_VARARGS | METH_KEYWORDS,
     "Register the Python references, the exception classes, check_properties and the reserved "
     "property marks in this module's state (called by hostmq.records and hostmq.record_check)."},
    {NULL, NULL, 0, NULL},
};

/* Every object the state holds, for the garbage collector (visit / clear) and the module's end. */
#define STATE_OBJECTS(st) \
    PyObject **all_[] = {&(st)->CorruptRecordError, &(st)->ValidationError, &(st)->check_properties, \
                         &(st)->references}; \
    PyObject **names_[] = {(st)->check_names, (st)->fields_names, (st)->encode_names, (st)->hash_names, \
                           (st)->cq_names, (st)->cq_one_names, (st)->single_names}; \
    const int counts_[] = {5, 2, E_COUNT, 1, 3, 3, 3}

static int codec_traverse(PyObject *m, visitproc visit, void *arg)
{
    CodecState *st = state_of(m);
    if (st == NULL)
        return 0;
    STATE_OBJECTS(st);
    for (size_t i = 0; i < sizeof all_ / sizeof all_[0]; i++)
        Py_VISIT(*all_[i]);
    for (size_t g = 0; g < sizeof names_ / sizeof names_[0]; g++)
        for (int k = 0; k < counts_[g]; k++)
            Py_VISIT(names_[g][k]);
    return 0;
}

static int codec_clear(PyObject *m)
{
    CodecState *st = state_of(m);
    if (st == NULL)
        return 0;
    STATE_OBJECTS(st);
    for (size_t i = 0; i < sizeof all_ / sizeof all_[0]; i++)
        Py_CLEAR(*all_[i]);
    for (size_t g = 0; g < sizeof names_ / sizeof names_[0]; g++)
        for (int k = 0; k < counts_[g]; k++)
            Py_CLEAR(names_[g][k]);
    st->reserved.n = 0;
    return 0;
}

static void codec_free(void *m) { codec_clear((PyObject *)m); }

static int intern_all(PyObject **out, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if ((out[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return -1;
    return 0;
}

/* LAYOUT: the generated constants as records.NATIVE_LAYOUT spells them (compared at its import). */
static int add_layout(PyObject *m)
{
    PyObject *lay = Py_BuildValue(
        "{s:i,s:k,s:k,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}",
        "MSG_HEADER", HDR_BYTES, "MAGIC_CODE", (unsigned long)MAGIC_CODE,
        "BLANK_MAGIC_CODE", (unsigned long)BLANK_MAGIC_CODE, "MIN_RECORD_BYTES", MIN_RECORD_BYTES,
        "MIN_BLANK_BYTES", MIN_BLANK_BYTES, "CQ_ENTRY", CQ_ENTRY_BYTES, "HOST_BYTES", HOST_BYTES,
        "TOPIC_LEN_BYTES", TOPIC_LEN_BYTES, "PROPS_LEN_BYTES", PROPS_LEN_BYTES,
        "PROPERTY_END", PROPERTY_END, "NAME_VALUE_SEP", NAME_VALUE_SEP);
    PyObject *field = PyDict_New(), *width = PyDict_New(), *cq_field = PyDict_New();
    int bad = lay == NULL || field == NULL || width == NULL || cq_field == NULL;
#define ADD_INT(d, name, value) \
    if (!bad) { PyObject *v_ = PyLong_FromLong(value); \
                bad = v_ == NULL || PyDict_SetItemString(d, name, v_) < 0; Py_XDECREF(v_); }
#define ADD_FIELD(name, off, w) ADD_INT(field, name, off) ADD_INT(width, name, w)
#define ADD_CQ_FIELD(name, off) ADD_INT(cq_field, name, off)
    HOSTMQ_RECORD_FIELDS(ADD_FIELD)
    HOSTMQ_CQ_FIELDS(ADD_CQ_FIELD)
#undef ADD_CQ_FIELD
#undef ADD_FIELD
#undef ADD_INT
    if (!bad)
        bad = PyDict_SetItemString(lay, "FIELD", field) < 0 || PyDict_SetItemString(lay, "WIDTH", width) < 0 ||
              PyDict_SetItemString(lay, "CQ_FIELD", cq_field) < 0 || PyModule_AddObjectRef(m, "LAYOUT", lay) < 0;
    Py_XDECREF(field);
    Py_XDECREF(width);
    Py_XDECREF(cq_field);
    Py_XDECREF(lay);
    return bad ? -1 : 0;
}

/* Py_mod_exec: fill this module object's state (called once per module object, per interpreter). */
static int codec_exec(PyObject *m)
{
    hm_crc32_init();
    static const char *const check[] = {"buf", "pos", "limit", "phys_offset", "verify_crc"};
    static const char *const fields[] = {"buf", "pos"};
    static const char *const encode[] = {
        "topic_b", "body", "props_b", "queue_id", "flag", "sys_flag", "born_ts_ms", "born_host",
        "store_ts_ms", "store_host", "reconsume_times", "prepared_tx_offset", "queue_offset",
        "phys_offset", "crc"};
    static const char *const hash[] = {"s"};
    static const char *const cq[] = {"phys_offsets", "sizes", "tag_codes"};
    static const char *const cq_one[] = {"phys_offset", "size", "tag_code"};
    static const char *const single[] = {"payload", "max_body_bytes", "max_props_bytes"};
    CodecState *st = state_of(m);
    if (intern_all(st->check_names, check, 5) < 0 || intern_all(st->fields_names, fields, 2) < 0 ||
        intern_all(st->encode_names, encode, E_COUNT) < 0 || intern_all(st->hash_names, hash, 1) < 0 ||
        intern_all(st->cq_names, cq, 3) < 0 || intern_all(st->cq_one_names, cq_one, 3) < 0 ||
        intern_all(st->single_names, single, 3) < 0)
        return -1;
    /* Until records.py binds its own classes, errors are plain ValueErrors. */
    st->CorruptRecordError = Py_NewRef(PyExc_ValueError);
    st->ValidationError = Py_NewRef(PyExc_ValueError);
    st->check_properties = NULL;
    st->reserved.n = 0;
    if ((st->references = PyDict_New()) == NULL)
        return -1;
    return add_layout(m);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, codec_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* Nothing is shared between module objects: each interpreter's has its own state. */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hostmq._codec",
    .m_doc = "The V1 record codec in C (see hostmq/_codec.c); hostmq.records binds its public names to it.",
    .m_size = sizeof(CodecState),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = codec_traverse,
    .m_clear = codec_clear,
    .m_free = codec_free,
};

PyMODINIT_FUNC PyInit__codec(void)
{
    return PyModuleDef_Init(&module);
}
