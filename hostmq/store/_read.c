/* hostmq.store._read: the per-message part of a consumer's read round in C.
 *
 * The pure-Python read side is the spec: ``py_check_one`` of hostmq/store/read_check.py (which runs
 * ``MessageExt.check``: ``_shape`` and ``records.decode_properties``) for one record, ``_get_all`` of
 * hostmq/store/reader.py for a round of consume-queue entries, ``py_check_rows`` for the rows of a
 * zero-copy batch. This module decides only the common case — a record that passes every one of
 * those checks and whose body is not compressed — over pinned buffers (the mapped commitlog file and
 * the consume-queue entries, held through the buffer protocol for the whole call) with the GIL
 * released; anything else (a record it refuses, a compressed body, an entry in another commitlog
 * file) it hands back to the Python caller, which asks the spec. So a record is never accepted here
 * that the spec would refuse (tests/store/test_read_native.py drives both on the same store files,
 * damaged records included, and compares every message, field by field), and the words of a skip
 * are always the spec's.
 *
 * A message it accepts is a real ``hostmq.message.MessageExt``: allocated from the class that
 * ``read_check`` binds (``_bind``) with the slots its ``__init__`` sets filled the same way (a
 * private copy of the record; everything else decoded lazily on access, by MessageExt itself). As
 * in the spec, what a message holds is validated after it was copied: a record is checked in place
 * without the GIL (to find the round's end) and its copy is checked again before it is handed out,
 * so bytes another process changes in between never reach a consumer unchecked.
 *
 * The layout is records.py's, from the generated include/record_layout.h (LAYOUT below is compared
 * with records.FIELD at import by read_check.py). Module state and multi-phase init as
 * hostmq/_codec.c. Nothing here sleeps, logs or retries; statuses are small ints that read_check.py
 * maps to its names (TAKE_*).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../include/record_layout.h"

#define LAYOUT_HOLDS(cond) _Static_assert(cond, "hostmq/include/record_layout.h: " #cond)
LAYOUT_HOLDS(OFF_TOTAL_SIZE == 0 && W_TOTAL_SIZE == 4 && W_MAGIC == 4 && W_QUEUE_ID == 4);
LAYOUT_HOLDS(W_QUEUE_OFFSET == 8 && W_SYS_FLAG == 4 && W_BODY_LENGTH == 4);
LAYOUT_HOLDS(HDR_BYTES == OFF_BODY_LENGTH + W_BODY_LENGTH);
LAYOUT_HOLDS(TOPIC_LEN_BYTES == 1 && PROPS_LEN_BYTES == 2);
LAYOUT_HOLDS(CQ_OFF_PHYS_OFFSET == 0 && CQ_OFF_SIZE == 8 && CQ_ENTRY_BYTES == 20);

/* An entry take() accepted in place: where its record is, which entry, and the counts before it. */
typedef struct {
    int64_t pos, size, index, removed_before, nbytes_before;
} Taken;

/* take()'s reasons for returning (read_check.TAKE_*) */
enum { TAKE_DONE = 0, TAKE_FULL = 1, TAKE_OTHER_FILE = 2, TAKE_ASK = 3 };
/* check_record()'s verdicts */
enum { REC_OK = 0, REC_ASK = 1 };
#define MAX_NONE_SLOTS 16
#ifdef Py_TPFLAGS_MANAGED_DICT
#define HAS_MANAGED_DICT(t) (((t)->tp_flags & Py_TPFLAGS_MANAGED_DICT) != 0)
#else
#define HAS_MANAGED_DICT(t) 0
#endif

typedef struct {
    PyTypeObject *msg_cls;                  /* hostmq.message.MessageExt, NULL until bound */
    PyObject *cq_dtype;                     /* records.CQ_ENTRY */
    Py_ssize_t raw_off, broker_off;         /* where its ``_raw`` and ``broker`` slots live */
    Py_ssize_t none_off[MAX_NONE_SLOTS];    /* the slots its __init__ sets to None */
    int n_none;
    uint32_t compressed_flag;               /* records.SYSFLAG_COMPRESSED */
} ReadState;

static inline ReadState *state_of(PyObject *m) { return (ReadState *)PyModule_GetState(m); }

static inline uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* What Python's strict UTF-8 decoder accepts (no overlong forms, no surrogates, at most U+10FFFF). */
static int utf8_ok(const unsigned char *s, int64_t n)
{
    int64_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {            /* ASCII runs, 8 bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c < 0xC2)
            return 0;
        if (c < 0xE0) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
            continue;
        }
        if (c < 0xF0) {
            if (i + 2 >= n) return 0;
            unsigned char c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) ||
                (s[i + 2] & 0xC0) != 0x80)
                return 0;
            i += 3;
            continue;
        }
        if (c < 0xF5) {
            if (i + 3 >= n) return 0;
            unsigned char c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F) ||
                (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80)
                return 0;
            i += 4;
            continue;
        }
        return 0;
    }
    return 1;
}

/* records.decode_properties accepts ``p``: UTF-8, and each non-empty "\x02"-separated pair holds a
 * "\x01" after a non-empty name. One pass: runs of 8 ASCII bytes without a separator (no byte below
 * 3, none above 0x7f) are skipped a word at a time; the strict UTF-8 check runs only when a byte
 * above 0x7f was met. */
static int props_ok(const unsigned char *p, int64_t n)
{
    int64_t seg = 0, first_sep = -1;
    int ascii = 1;
    for (int64_t i = 0; i < n; i++) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if ((((w - 0x0303030303030303ull) & ~w) | w) & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        unsigned char c = p[i];
        if (c == NAME_VALUE_SEP) {
            if (first_sep < 0) first_sep = i;
        } else if (c == PROPERTY_END) {
            if (i > seg && (first_sep < 0 || first_sep == seg))
                return 0;
            seg = i + 1;
            first_sep = -1;
        } else if (c & 0x80) {
            ascii = 0;
        }
    }
    if (n > seg && (first_sep < 0 || first_sep == seg))
        return 0;
    return ascii || utf8_ok(p, n);
}

/* REC_OK when the ``size`` bytes at ``pos`` of ``buf`` are one record that MessageExt.check(topic,
 * queue_id, queue_offset) accepts and whose body is not compressed; REC_ASK for anything else (the
 * spec then decides, and words its refusal). The order of the checks is _shape's. */
static int check_record(const unsigned char *buf, int64_t len, int64_t pos, int64_t size,
                        const unsigned char *topic, int64_t tlen, int64_t queue_id, int64_t queue_offset,
                        uint32_t compressed_flag)
{
    if (pos < 0 || size < MIN_RECORD_BYTES || pos > len || size > len - pos)
        return REC_ASK;
    const unsigned char *r = buf + pos;
    int64_t n = size;
    if (be32(r + OFF_MAGIC) != MAGIC_CODE || (int64_t)(int32_t)be32(r + OFF_TOTAL_SIZE) != n)
        return REC_ASK;
    int64_t blen = (int32_t)be32(r + OFF_BODY_LENGTH);
    int64_t tstart = HDR_BYTES + TOPIC_LEN_BYTES + blen;
    if (blen < 0 || tstart + PROPS_LEN_BYTES > n)
        return REC_ASK;
    int64_t ppos = tstart + r[tstart - 1];
    if (ppos + PROPS_LEN_BYTES > n)
        return REC_ASK;
    int64_t pstart = ppos + PROPS_LEN_BYTES;
    if (pstart + ((r[ppos] << 8) | r[ppos + 1]) != n)
        return REC_ASK;
    if (pstart < n && r[n - 1] != PROPERTY_END)
        return REC_ASK;
    if (ppos - tstart != tlen || memcmp(r + tstart, topic, (size_t)tlen) != 0 || !utf8_ok(r + tstart, tlen))
        return REC_ASK;
    if ((int64_t)(int32_t)be32(r + OFF_QUEUE_ID) != queue_id ||
        (int64_t)be64(r + OFF_QUEUE_OFFSET) != queue_offset)
        return REC_ASK;
    if (!props_ok(r + pstart, n - pstart))
        return REC_ASK;
    if (be32(r + OFF_SYS_FLAG) & compressed_flag)
        return REC_ASK;         /* the spec inflates it (and keeps the body) */
    return REC_OK;
}

/* The private copy of the ``n`` bytes at ``p``, if the copy (not the mapped file, which another
 * process may change meanwhile) is a record check_record accepts: copy, then validate, as the spec
 * (MessageExt(bytes).check). NULL with an error set when out of memory; NULL without one when the
 * copy is refused (the caller then hands the entry to the spec). */
static PyObject *checked_copy(ReadState *st, const unsigned char *p, int64_t n, const unsigned char *topic,
                              int64_t tlen, int64_t queue_id, int64_t queue_offset)
{
    PyObject *raw = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
    if (raw == NULL)
        return NULL;
    if (check_record((const unsigned char *)PyBytes_AS_STRING(raw), n, 0, n, topic, tlen, queue_id, queue_offset,
                     st->compressed_flag) != REC_OK) {
        Py_DECREF(raw);
        return NULL;
    }
    return raw;
}

/* A MessageExt of ``raw`` (a reference stolen): what MessageExt(raw, broker) builds. */
static PyObject *new_message(ReadState *st, PyObject *raw, PyObject *broker)
{
    PyObject *m = st->msg_cls->tp_alloc(st->msg_cls, 0);
    if (m == NULL) {
        Py_DECREF(raw);
        return NULL;
    }
    char *base = (char *)m;
    *(PyObject **)(base + st->raw_off) = raw;
    *(PyObject **)(base + st->broker_off) = Py_NewRef(broker);
    for (int k = 0; k < st->n_none; k++)
        *(PyObject **)(base + st->none_off[k]) = Py_NewRef(Py_None);
    return m;
}

static int get_buffer(PyObject *o, Py_buffer *v, const char *what)
{
    if (PyObject_GetBuffer(o, v, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous buffer", what);
        return -1;
    }
    return 0;
}

/* Consume-queue entries: an array of records.CQ_ENTRY (its dtype compared, big-endian rows; asking
 * numpy for a structured buffer's format costs microseconds) or raw bytes. */
static int get_entries(ReadState *st, PyObject *o, Py_buffer *v)
{
    if (!PyBytes_Check(o) && !PyByteArray_Check(o)) {
        PyObject *dt = PyObject_GetAttrString(o, "dtype");
        int same = dt == NULL ? -1 : PyObject_RichCompareBool(dt, st->cq_dtype, Py_EQ);
        Py_XDECREF(dt);
        if (same != 1) {
            if (same < 0)
                PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "entries must be records.CQ_ENTRY rows (big-endian) or bytes");
            return -1;
        }
    }
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_SetString(PyExc_TypeError, "entries must be a contiguous buffer");
        return -1;
    }
    return 0;
}

static int get_i64(PyObject *o, int64_t *out)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

static int need_bound(ReadState *st)
{
    if (st->msg_cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "hostmq.store._read: MessageExt not bound (read_check binds it)");
        return -1;
    }
    return 0;
}

/* take(entries, first, mm, file_from, file_end, cl_min, queue_offset, topic_b, queue_id, max_bytes,
 *      nbytes, broker, out) -> (next, reason, nbytes, removed)
 *
 * One step of reader._get_all over consume-queue ``entries`` (CQ_ENTRY rows, the first read as
 * ``queue_offset``) from row ``first``: entries below ``cl_min`` are removed; a message that would
 * take ``nbytes`` past ``max_bytes`` (with ``out`` not empty) ends the round (TAKE_FULL); an entry
 * outside [file_from, file_end) — the commitlog file ``mm`` maps — returns TAKE_OTHER_FILE; a record
 * check_record does not accept returns TAKE_ASK (the entry at ``next`` is the caller's to check);
 * every accepted one is appended to ``out`` as a MessageExt. TAKE_DONE: every entry was taken. */
static PyObject *take(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ReadState *st = state_of(module);
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "take() takes 13 arguments");
        return NULL;
    }
    if (need_bound(st) < 0)
        return NULL;
    int64_t first, file_from, file_end, cl_min, qoff0, queue_id, max_bytes, nbytes;
    if (get_i64(args[1], &first) < 0 || get_i64(args[3], &file_from) < 0 || get_i64(args[4], &file_end) < 0 ||
        get_i64(args[5], &cl_min) < 0 || get_i64(args[6], &qoff0) < 0 || get_i64(args[8], &queue_id) < 0 ||
        get_i64(args[9], &max_bytes) < 0 || get_i64(args[10], &nbytes) < 0)
        return NULL;
    PyObject *broker = args[11], *out = args[12];
    if (!PyList_Check(out) || !PyBytes_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "take(): topic_b must be bytes and out a list");
        return NULL;
    }
    const unsigned char *topic = (const unsigned char *)PyBytes_AS_STRING(args[7]);
    int64_t tlen = PyBytes_GET_SIZE(args[7]);
    Py_buffer ents, mm = {0};
    if (get_entries(st, args[0], &ents) < 0)
        return NULL;
    int have_mm = args[2] != Py_None;
    if (have_mm && get_buffer(args[2], &mm, "mm") < 0) {
        PyBuffer_Release(&ents);
        return NULL;
    }
    if (!have_mm)
        file_from = file_end = 0;
    int64_t count = ents.len / CQ_ENTRY_BYTES;
    if (first < 0 || first > count || ents.len % CQ_ENTRY_BYTES) {
        PyBuffer_Release(&ents);
        if (have_mm) PyBuffer_Release(&mm);
        PyErr_SetString(PyExc_ValueError, "take(): entries are not CQ_ENTRY rows, or first is outside them");
        return NULL;
    }
    Taken *ok = count > first ? malloc(sizeof(Taken) * (size_t)(count - first)) : NULL;
    if (count > first && ok == NULL) {
        PyBuffer_Release(&ents);
        if (have_mm) PyBuffer_Release(&mm);
        return PyErr_NoMemory();
    }
    const unsigned char *e = ents.buf, *b = have_mm ? mm.buf : NULL;
    int64_t blen = have_mm ? mm.len : 0;
    int have = PyList_GET_SIZE(out) > 0;
    int64_t i = first, n_ok = 0, removed = 0;
    int reason = TAKE_DONE;
    uint32_t cflag = st->compressed_flag;
    Py_BEGIN_ALLOW_THREADS
    for (; i < count; i++) {
        const unsigned char *row = e + i * CQ_ENTRY_BYTES;
        int64_t phys = (int64_t)be64(row + CQ_OFF_PHYS_OFFSET), size = (int32_t)be32(row + CQ_OFF_SIZE);
        if (phys < cl_min) {
            removed++;
            continue;
        }
        if ((have || n_ok) && nbytes + size > max_bytes) {
            reason = TAKE_FULL;
            break;
        }
        if (!(file_from <= phys && phys < file_end)) {
            reason = TAKE_OTHER_FILE;
            break;
        }
        if (check_record(b, blen, phys - file_from, size, topic, tlen, queue_id, qoff0 + i, cflag) != REC_OK) {
            reason = TAKE_ASK;
            break;
        }
        ok[n_ok] = (Taken){phys - file_from, size, i, removed, nbytes};
        n_ok++;
        nbytes += size;
    }
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    int64_t k = 0;
    int failed = 0;
    for (; k < n_ok; k++) {
        PyObject *raw = checked_copy(st, b + ok[k].pos, ok[k].size, topic, tlen, queue_id, qoff0 + ok[k].index);
        if (raw == NULL) {
            if (PyErr_Occurred()) {
                failed = 1;
                break;
            }
            /* changed since it was checked in place: the spec reads this entry again, from here */
            i = ok[k].index;
            reason = TAKE_ASK;
            removed = ok[k].removed_before;
            nbytes = ok[k].nbytes_before;
            break;
        }
        PyObject *m = new_message(st, raw, broker);
        if (m == NULL || PyList_Append(out, m) < 0) {
            Py_XDECREF(m);
            failed = 1;
            break;
        }
        Py_DECREF(m);
    }
    if (!failed)
        result = Py_BuildValue("(LiLL)", (long long)i, reason, (long long)nbytes, (long long)removed);
    free(ok);
    PyBuffer_Release(&ents);
    if (have_mm)
        PyBuffer_Release(&mm);
    return result;
}

/* checked(mm, pos, size, topic_b, queue_id, queue_offset, broker) -> MessageExt or None: the
 * message at ``pos`` if check_record accepts it, else None (the caller asks the spec). */
static PyObject *checked(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ReadState *st = state_of(module);
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "checked() takes 7 arguments");
        return NULL;
    }
    if (need_bound(st) < 0)
        return NULL;
    int64_t pos, size, queue_id, qoff;
    if (get_i64(args[1], &pos) < 0 || get_i64(args[2], &size) < 0 || get_i64(args[4], &queue_id) < 0 ||
        get_i64(args[5], &qoff) < 0)
        return NULL;
    if (!PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "checked(): topic_b must be bytes");
        return NULL;
    }
    Py_buffer mm;
    if (get_buffer(args[0], &mm, "mm") < 0)
        return NULL;
    PyObject *res;
    const unsigned char *topic = (const unsigned char *)PyBytes_AS_STRING(args[3]);
    int64_t tlen = PyBytes_GET_SIZE(args[3]);
    if (check_record(mm.buf, mm.len, pos, size, topic, tlen, queue_id, qoff, st->compressed_flag) == REC_OK) {
        PyObject *raw = checked_copy(st, (const unsigned char *)mm.buf + pos, size, topic, tlen, queue_id, qoff);
        res = raw != NULL ? new_message(st, raw, args[6]) : PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    } else {
        res = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&mm);
    return res;
}

/* check_rows(mm, rel, sizes, queue_offsets, topic_b, queue_id, ok) -> how many rows were not accepted:
 * ``ok[i]`` (a bool buffer) tells whether check_record accepts row i (int64 ``rel`` / ``sizes`` /
 * ``queue_offsets``); the rows it does not accept are the caller's to ask the spec about. */
static PyObject *check_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ReadState *st = state_of(module);
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "check_rows() takes 7 arguments");
        return NULL;
    }
    int64_t queue_id;
    if (get_i64(args[5], &queue_id) < 0)
        return NULL;
    if (!PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "check_rows(): topic_b must be bytes");
        return NULL;
    }
    Py_buffer mm, rel, sizes, qoffs, ok;
    if (get_buffer(args[0], &mm, "mm") < 0)
        return NULL;
    if (get_buffer(args[1], &rel, "rel") < 0) { PyBuffer_Release(&mm); return NULL; }
    if (get_buffer(args[2], &sizes, "sizes") < 0) { PyBuffer_Release(&mm); PyBuffer_Release(&rel); return NULL; }
    if (get_buffer(args[3], &qoffs, "queue_offsets") < 0) {
        PyBuffer_Release(&mm); PyBuffer_Release(&rel); PyBuffer_Release(&sizes);
        return NULL;
    }
    if (PyObject_GetBuffer(args[6], &ok, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&mm); PyBuffer_Release(&rel); PyBuffer_Release(&sizes); PyBuffer_Release(&qoffs);
        return NULL;
    }
    int64_t n = ok.len;
    PyObject *res = NULL;
    if (rel.len != n * 8 || sizes.len != n * 8 || qoffs.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "check_rows(): rel, sizes and queue_offsets must be int64 rows, one per ok");
    } else {
        const unsigned char *topic = (const unsigned char *)PyBytes_AS_STRING(args[4]);
        int64_t tlen = PyBytes_GET_SIZE(args[4]), refused = 0;
        const int64_t *r = rel.buf, *s = sizes.buf, *q = qoffs.buf;
        unsigned char *o = ok.buf;
        uint32_t cflag = st->compressed_flag;
        Py_BEGIN_ALLOW_THREADS
        for (int64_t i = 0; i < n; i++) {
            int good = check_record(mm.buf, mm.len, r[i], s[i], topic, tlen, queue_id, q[i], cflag) == REC_OK;
            o[i] = (unsigned char)good;
            refused += !good;
        }
        Py_END_ALLOW_THREADS
        res = PyLong_FromLongLong(refused);
    }
    PyBuffer_Release(&mm); PyBuffer_Release(&rel); PyBuffer_Release(&sizes); PyBuffer_Release(&qoffs);
    PyBuffer_Release(&ok);
    return res;
}

/* gather(mm, starts, lens, at, out) -> None: out[at[i]:at[i] + lens[i]] = mm[starts[i]:starts[i] + lens[i]]
 * for every row (int64 ``starts`` / ``lens`` / ``at``), with the GIL released — MessageBatch.bodies_joined's
 * copy. Every span is checked against both buffers first; ValueError, and nothing copied, if one is out. */
static PyObject *gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "gather() takes 5 arguments");
        return NULL;
    }
    Py_buffer mm, starts, lens, at, out;
    if (get_buffer(args[0], &mm, "mm") < 0)
        return NULL;
    if (get_buffer(args[1], &starts, "starts") < 0) { PyBuffer_Release(&mm); return NULL; }
    if (get_buffer(args[2], &lens, "lens") < 0) { PyBuffer_Release(&mm); PyBuffer_Release(&starts); return NULL; }
    if (get_buffer(args[3], &at, "at") < 0) {
        PyBuffer_Release(&mm); PyBuffer_Release(&starts); PyBuffer_Release(&lens);
        return NULL;
    }
    if (PyObject_GetBuffer(args[4], &out, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&mm); PyBuffer_Release(&starts); PyBuffer_Release(&lens); PyBuffer_Release(&at);
        return NULL;
    }
    int64_t n = starts.len / 8;
    const int64_t *s = starts.buf, *l = lens.buf, *a = at.buf;
    int bad = starts.len % 8 || lens.len != starts.len || at.len != starts.len;
    for (int64_t i = 0; !bad && i < n; i++)
        bad = s[i] < 0 || l[i] < 0 || a[i] < 0 || s[i] > mm.len || l[i] > mm.len - s[i] ||
              a[i] > out.len || l[i] > out.len - a[i];
    if (!bad) {
        const unsigned char *src = mm.buf;
        unsigned char *dst = out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (int64_t i = 0; i < n; i++)
            memcpy(dst + a[i], src + s[i], (size_t)l[i]);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&mm); PyBuffer_Release(&starts); PyBuffer_Release(&lens); PyBuffer_Release(&at);
    PyBuffer_Release(&out);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "gather(): int64 rows of equal length, every span inside both buffers");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* batch_rows(entries, mm, file_from, file_end, cl_min, queue_offset, topic_b, queue_id, rel, sizes,
 * queue_offsets, ok) -> -1, or how many rows check_record did not accept: reader.get_batch's common
 * case in one pass. For n consume-queue ``entries`` (CQ_ENTRY rows, read once each) whose records all
 * lie in the mapped file [file_from, file_end) with the first at or past ``cl_min``, it fills the
 * int64 rows ``rel`` (position in the file), ``sizes`` and ``queue_offsets`` (queue_offset + i) and the
 * bool ``ok`` (check_rows's verdict). -1 (nothing decided) when a record lies outside the file or the
 * first below cl_min: the caller takes the general path, as it would without this module. */
static PyObject *batch_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ReadState *st = state_of(module);
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "batch_rows() takes 12 arguments");
        return NULL;
    }
    int64_t file_from, file_end, cl_min, queue_offset, queue_id;
    if (get_i64(args[2], &file_from) < 0 || get_i64(args[3], &file_end) < 0 || get_i64(args[4], &cl_min) < 0 ||
        get_i64(args[5], &queue_offset) < 0 || get_i64(args[7], &queue_id) < 0)
        return NULL;
    if (!PyBytes_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "batch_rows(): topic_b must be bytes");
        return NULL;
    }
    Py_buffer ents, mm, out[4];
    int held = 0;
    PyObject *res = NULL;
    if (get_entries(st, args[0], &ents) < 0)
        return NULL;
    if (get_buffer(args[1], &mm, "mm") < 0) {
        PyBuffer_Release(&ents);
        return NULL;
    }
    for (; held < 4; held++)
        if (PyObject_GetBuffer(args[8 + held], &out[held], PyBUF_SIMPLE | PyBUF_WRITABLE) < 0)
            goto done;
    int64_t n = ents.len / CQ_ENTRY_BYTES;
    if (ents.len % CQ_ENTRY_BYTES || out[0].len != n * 8 || out[1].len != n * 8 || out[2].len != n * 8 ||
        out[3].len != n) {
        PyErr_SetString(PyExc_ValueError, "batch_rows(): rel, sizes, queue_offsets (int64) and ok (bool): one row per entry");
        goto done;
    }
    const unsigned char *e = ents.buf, *topic = (const unsigned char *)PyBytes_AS_STRING(args[6]);
    int64_t tlen = PyBytes_GET_SIZE(args[6]), refused = 0;
    int64_t *rel = out[0].buf, *sizes = out[1].buf, *qoffs = out[2].buf;
    unsigned char *ok = out[3].buf;
    uint32_t cflag = st->compressed_flag;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *row = e + i * CQ_ENTRY_BYTES;
        int64_t phys = (int64_t)be64(row + CQ_OFF_PHYS_OFFSET), size = (int32_t)be32(row + CQ_OFF_SIZE);
        if (phys < file_from || phys >= file_end || (i == 0 && phys < cl_min)) {
            refused = -1;
            break;
        }
        rel[i] = phys - file_from;
        sizes[i] = size;
        qoffs[i] = queue_offset + i;
    }
    if (refused == 0)
        for (int64_t i = 0; i < n; i++) {
            int good = check_record(mm.buf, mm.len, rel[i], sizes[i], topic, tlen, queue_id, qoffs[i], cflag) == REC_OK;
            ok[i] = (unsigned char)good;
            refused += !good;
        }
    Py_END_ALLOW_THREADS
    res = PyLong_FromLongLong(refused);
done:
    for (int k = 0; k < held; k++)
        PyBuffer_Release(&out[k]);
    PyBuffer_Release(&ents);
    PyBuffer_Release(&mm);
    return res;
}

/* body_offsets(mm, rel, sizes, offsets) -> total bytes, or -1: for records check_record accepted at
 * ``rel`` (``sizes`` bytes each) of ``mm``, ``offsets[i + 1] = offsets[i] + body length of record i``
 * (int64, n + 1 rows, offsets[0] = 0) — MessageBatch.bodies_joined's offsets. -1 (nothing decided)
 * when a body is compressed or a record no longer holds its body (the caller takes its general path). */
static PyObject *body_offsets(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ReadState *st = state_of(module);
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "body_offsets() takes 4 arguments");
        return NULL;
    }
    Py_buffer mm, rel, sizes, offs;
    if (get_buffer(args[0], &mm, "mm") < 0)
        return NULL;
    if (get_buffer(args[1], &rel, "rel") < 0) { PyBuffer_Release(&mm); return NULL; }
    if (get_buffer(args[2], &sizes, "sizes") < 0) { PyBuffer_Release(&mm); PyBuffer_Release(&rel); return NULL; }
    if (PyObject_GetBuffer(args[3], &offs, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&mm); PyBuffer_Release(&rel); PyBuffer_Release(&sizes);
        return NULL;
    }
    int64_t n = rel.len / 8, total = 0;
    PyObject *res = NULL;
    if (rel.len % 8 || sizes.len != rel.len || offs.len != (n + 1) * 8) {
        PyErr_SetString(PyExc_ValueError, "body_offsets(): int64 rel and sizes of one length, offsets one row longer");
    } else {
        const unsigned char *b = mm.buf;
        const int64_t *r = rel.buf, *s = sizes.buf;
        int64_t *o = offs.buf;
        uint32_t cflag = st->compressed_flag;
        o[0] = 0;
        for (int64_t i = 0; i < n; i++) {
            if (r[i] < 0 || s[i] < HDR_BYTES || r[i] > mm.len || s[i] > mm.len - r[i]) { total = -1; break; }
            const unsigned char *h = b + r[i];
            int64_t blen = (int32_t)be32(h + OFF_BODY_LENGTH);
            if ((be32(h + OFF_SYS_FLAG) & cflag) || blen < 0 || blen > s[i] - HDR_BYTES) { total = -1; break; }
            total += blen;
            o[i + 1] = total;
        }
        res = PyLong_FromLongLong(total);
    }
    PyBuffer_Release(&mm); PyBuffer_Release(&rel); PyBuffer_Release(&sizes); PyBuffer_Release(&offs);
    return res;
}

/* copy_bodies(mm, rel, offsets, out) -> None: out[offsets[i]:offsets[i + 1]] = the body of the record at
 * rel[i] (its first offsets[i + 1] - offsets[i] bytes after the header), with the GIL released — the copy
 * after body_offsets. Every span is checked against both buffers first; ValueError, nothing copied. */
static PyObject *copy_bodies(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "copy_bodies() takes 4 arguments");
        return NULL;
    }
    Py_buffer mm, rel, offs, out;
    if (get_buffer(args[0], &mm, "mm") < 0)
        return NULL;
    if (get_buffer(args[1], &rel, "rel") < 0) { PyBuffer_Release(&mm); return NULL; }
    if (get_buffer(args[2], &offs, "offsets") < 0) { PyBuffer_Release(&mm); PyBuffer_Release(&rel); return NULL; }
    if (PyObject_GetBuffer(args[3], &out, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&mm); PyBuffer_Release(&rel); PyBuffer_Release(&offs);
        return NULL;
    }
    int64_t n = rel.len / 8;
    const int64_t *r = rel.buf, *o = offs.buf;
    int bad = rel.len % 8 || offs.len != (n + 1) * 8 || o[0] != 0;
    for (int64_t i = 0; !bad && i < n; i++) {
        int64_t len = o[i + 1] - o[i];
        bad = len < 0 || r[i] < 0 || r[i] > mm.len - HDR_BYTES || len > mm.len - HDR_BYTES - r[i] ||
              o[i + 1] > out.len;
    }
    if (!bad) {
        const unsigned char *src = mm.buf;
        unsigned char *dst = out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (int64_t i = 0; i < n; i++)
            memcpy(dst + o[i], src + r[i] + HDR_BYTES, (size_t)(o[i + 1] - o[i]));
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&mm); PyBuffer_Release(&rel); PyBuffer_Release(&offs); PyBuffer_Release(&out);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "copy_bodies(): int64 rel, offsets one row longer from 0, every span inside both buffers");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* tail_scan(mm, rel, end, base, max_records, max_topic, skip_topic, out) -> (rel, status, counted): the common
 * case of store/tail.py's scan (dispatch.scan_records, the spec) over one mapped commitlog file:
 * records from ``rel`` while they end by ``end``, each checked as records_checks.sound_at checks it,
 * at most ``max_records`` kept. For each record it appends (topic, queue_id, queue_offset, phys,
 * size, tag code) to the list ``out`` — the consume-queue entry the dispatcher will write — except
 * for ``skip_topic`` (the schedule topic, whose tag code is a due time only the broker computes),
 * which counts towards ``max_records`` all the same, as in the spec. Returns (rel, status, counted).
 * It stops, handing the rest to the spec, at the first record it does not decide alone (status 1):
 * a blank or broken one, a topic that is not a valid name, TAGS that are not ASCII. Status 0: done
 * (``rel`` is ``end``, or ``max_records`` were kept). */
static int topic_char_ok(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '%' || c == '|';
}

static PyObject *tail_scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "tail_scan() takes 8 arguments");
        return NULL;
    }
    int64_t rel, end, base, max_records, max_topic;
    if (get_i64(args[1], &rel) < 0 || get_i64(args[2], &end) < 0 || get_i64(args[3], &base) < 0 ||
        get_i64(args[4], &max_records) < 0 || get_i64(args[5], &max_topic) < 0)
        return NULL;
    if (!PyBytes_Check(args[6]) || !PyList_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "tail_scan(): skip_topic must be bytes and out a list");
        return NULL;
    }
    Py_buffer mm;
    if (get_buffer(args[0], &mm, "mm") < 0)
        return NULL;
    const unsigned char *b = mm.buf, *skip = (const unsigned char *)PyBytes_AS_STRING(args[6]);
    Py_ssize_t skip_len = PyBytes_GET_SIZE(args[6]);
    PyObject *out = args[7], *last_topic = NULL;
    const unsigned char *last_t = NULL;
    int64_t last_tlen = -1, kept = 0;
    int status = 0;
    static const unsigned char tags_name[] = "\x02TAGS\x01";
    const int64_t tn = (int64_t)sizeof tags_name - 1;
    if (end > mm.len)
        end = mm.len;
    while (rel < end && kept < max_records) {
        if (rel < 0 || rel + HDR_BYTES > end) { status = 1; break; }       /* a blank, or broken: the spec */
        const unsigned char *r = b + rel;
        int64_t total = (int32_t)be32(r + OFF_TOTAL_SIZE), blen = (int32_t)be32(r + OFF_BODY_LENGTH);
        int64_t qid = (int32_t)be32(r + OFF_QUEUE_ID), qoff = (int64_t)be64(r + OFF_QUEUE_OFFSET);
        if (be32(r + OFF_MAGIC) != MAGIC_CODE || total < MIN_RECORD_BYTES || total > end - rel ||
            (int64_t)be64(r + OFF_PHYS_OFFSET) != base + rel || qid < 0 || qoff < 0 || blen < 0 ||
            blen > total - MIN_RECORD_BYTES) { status = 1; break; }
        int64_t tpos = HDR_BYTES + blen, tlen = r[tpos], ppos = tpos + TOPIC_LEN_BYTES + tlen, stop = total;
        if (ppos + PROPS_LEN_BYTES > stop) { status = 1; break; }
        int64_t plen = (r[ppos] << 8) | r[ppos + 1], pstart = ppos + PROPS_LEN_BYTES;
        if (pstart + plen != stop || (plen && r[stop - 1] != PROPERTY_END)) { status = 1; break; }
        const unsigned char *t = r + tpos + TOPIC_LEN_BYTES;
        int valid = tlen >= 1 && tlen <= max_topic;
        for (int64_t i = 0; valid && i < tlen; i++)
            valid = topic_char_ok(t[i]);
        if (!valid) { status = 1; break; }               /* the spec skips it, counts and logs it */
        if (tlen == skip_len && memcmp(t, skip, (size_t)tlen) == 0) {
            kept++;                                     /* counted as the spec counts it, not kept */
            rel += total;
            continue;
        }
        /* TAGS as dispatch._prop finds it: the first "\x02TAGS\x01" in "\x02" + properties, up to the next \x02 */
        int64_t code = 0, found = -1;
        const unsigned char *pr = r + pstart;
        if (plen >= tn - 1 && memcmp(pr, tags_name + 1, (size_t)(tn - 1)) == 0)
            found = tn - 1;
        for (int64_t i = 0; found < 0 && i + tn <= plen; i++) {
            const unsigned char *hit = memchr(pr + i, 0x02, (size_t)(plen - i));
            if (hit == NULL)
                break;
            i = hit - pr;
            if (i + tn <= plen && memcmp(hit, tags_name, (size_t)tn) == 0)
                found = i + tn;
        }
        if (found >= 0) {
            uint32_t h = 0;
            int ascii = 1;
            for (int64_t i = found; i < plen && pr[i] != 0x02; i++) {
                ascii &= pr[i] < 0x80;
                h = 31u * h + pr[i];
            }
            if (!ascii) { status = 1; break; }           /* decoded with replacement characters: the spec */
            code = (int32_t)h;
        }
        if (last_topic == NULL || tlen != last_tlen || memcmp(t, last_t, (size_t)tlen) != 0) {
            Py_XDECREF(last_topic);
            last_topic = PyUnicode_DecodeASCII((const char *)t, tlen, NULL);
            if (last_topic == NULL) { status = -1; break; }
            last_t = t;
            last_tlen = tlen;
        }
        PyObject *row = Py_BuildValue("(OLLLLL)", last_topic, (long long)qid, (long long)qoff, (long long)(base + rel),
                                      (long long)total, (long long)code);
        if (row == NULL || PyList_Append(out, row) < 0) {
            Py_XDECREF(row);
            status = -1;
            break;
        }
        Py_DECREF(row);
        kept++;
        rel += total;
    }
    Py_XDECREF(last_topic);
    PyBuffer_Release(&mm);
    if (status < 0)
        return NULL;
    return Py_BuildValue("(LiL)", (long long)rel, status, (long long)kept);
}

/* The byte offset of a slot from its member descriptor (an object slot of ``cls``). */
static int slot_offset(PyTypeObject *cls, PyObject *descr, Py_ssize_t *off)
{
    if (!PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
        PyErr_SetString(PyExc_TypeError, "_bind: a slot's member descriptor expected");
        return -1;
    }
    PyMemberDef *d = ((PyMemberDescrObject *)descr)->d_member;
    if (d->type != T_OBJECT_EX || d->offset < (Py_ssize_t)sizeof(PyObject) ||
        d->offset + (Py_ssize_t)sizeof(PyObject *) > cls->tp_basicsize ||
        !PyType_IsSubtype(cls, PyDescr_TYPE(descr))) {
        PyErr_SetString(PyExc_TypeError, "_bind: not an object slot of the class");
        return -1;
    }
    *off = d->offset;
    return 0;
}

/* _bind(cls, raw_slot, broker_slot, none_slots, compressed_flag, cq_dtype): the MessageExt class, the
 * member descriptors of the slots its __init__ sets (the record, the broker, the ones set to None),
 * records.SYSFLAG_COMPRESSED and records.CQ_ENTRY. */
static PyObject *bind(PyObject *module, PyObject *args)
{
    ReadState *st = state_of(module);
    PyObject *cls, *raw, *broker, *nones, *cq_dtype;
    unsigned long flag;
    if (!PyArg_ParseTuple(args, "O!OOO!kO", &PyType_Type, &cls, &raw, &broker, &PyTuple_Type, &nones, &flag,
                          &cq_dtype))
        return NULL;
    PyTypeObject *t = (PyTypeObject *)cls;
    if (PyTuple_GET_SIZE(nones) > MAX_NONE_SLOTS || HAS_MANAGED_DICT(t) ||
        t->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "_bind: a class with __slots__ only (and at most 16 set to None)");
        return NULL;
    }
    ReadState s = *st;
    if (slot_offset(t, raw, &s.raw_off) < 0 || slot_offset(t, broker, &s.broker_off) < 0)
        return NULL;
    s.n_none = (int)PyTuple_GET_SIZE(nones);
    for (int k = 0; k < s.n_none; k++)
        if (slot_offset(t, PyTuple_GET_ITEM(nones, k), &s.none_off[k]) < 0)
            return NULL;
    s.compressed_flag = (uint32_t)flag;
    s.msg_cls = (PyTypeObject *)Py_NewRef(cls);
    s.cq_dtype = Py_NewRef(cq_dtype);
    Py_XDECREF(st->msg_cls);
    Py_XDECREF(st->cq_dtype);
    *st = s;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"take", (PyCFunction)(void (*)(void))take, METH_FASTCALL, "One step of reader._get_all (see hostmq/store/_read.c)."},
    {"checked", (PyCFunction)(void (*)(void))checked, METH_FASTCALL, "read_check.check_one's common case, or None."},
    {"check_rows", (PyCFunction)(void (*)(void))check_rows, METH_FASTCALL, "read_check.check_rows's common case."},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL, "MessageBatch.bodies_joined's copy."},
    {"batch_rows", (PyCFunction)(void (*)(void))batch_rows, METH_FASTCALL, "reader.get_batch's common case."},
    {"tail_scan", (PyCFunction)(void (*)(void))tail_scan, METH_FASTCALL, "store/tail.py's scan, its common case."},
    {"body_offsets", (PyCFunction)(void (*)(void))body_offsets, METH_FASTCALL, "bodies_joined's offsets, or -1."},
    {"copy_bodies", (PyCFunction)(void (*)(void))copy_bodies, METH_FASTCALL, "bodies_joined's copy after body_offsets."},
    {"_bind", bind, METH_VARARGS, "Bind MessageExt and its slots (read_check.py does, at import)."},
    {NULL, NULL, 0, NULL},
};

static int read_exec(PyObject *m)
{
    ReadState *st = state_of(m);
    memset(st, 0, sizeof(*st));
    PyObject *lay = Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:k,s:i,s:i}",
                                  "total_size", OFF_TOTAL_SIZE, "magic", OFF_MAGIC, "queue_id", OFF_QUEUE_ID,
                                  "queue_offset", OFF_QUEUE_OFFSET, "sys_flag", OFF_SYS_FLAG,
                                  "body_length", OFF_BODY_LENGTH, "MSG_HEADER", HDR_BYTES,
                                  "MIN_RECORD_BYTES", MIN_RECORD_BYTES, "CQ_ENTRY", CQ_ENTRY_BYTES,
                                  "MAGIC_CODE", (unsigned long)MAGIC_CODE, "PROPERTY_END", PROPERTY_END,
                                  "NAME_VALUE_SEP", NAME_VALUE_SEP);
    if (lay == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(m, "LAYOUT", lay);
    Py_DECREF(lay);
    if (rc < 0)
        return -1;
    return PyModule_AddIntConstant(m, "TAKE_DONE", TAKE_DONE) < 0 ||
           PyModule_AddIntConstant(m, "TAKE_FULL", TAKE_FULL) < 0 ||
           PyModule_AddIntConstant(m, "TAKE_OTHER_FILE", TAKE_OTHER_FILE) < 0 ||
           PyModule_AddIntConstant(m, "TAKE_ASK", TAKE_ASK) < 0 ? -1 : 0;
}

static int read_traverse(PyObject *m, visitproc visit, void *arg)
{
    ReadState *st = state_of(m);
    Py_VISIT(st->msg_cls);
    Py_VISIT(st->cq_dtype);
    return 0;
}

static int read_clear(PyObject *m)
{
    ReadState *st = state_of(m);
    Py_CLEAR(st->msg_cls);
    Py_CLEAR(st->cq_dtype);
    return 0;
}

static void read_free(void *m) { read_clear((PyObject *)m); }

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, read_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hostmq.store._read",
    .m_doc = "The consumer's read round in C (see hostmq/store/_read.c); read_check.py and reader.py use it.",
    .m_size = sizeof(ReadState),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = read_traverse,
    .m_clear = read_clear,
    .m_free = read_free,
};

PyMODINIT_FUNC PyInit__read(void)
{
    return PyModuleDef_Init(&module);
}
