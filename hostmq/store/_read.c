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
LAYOUT_HOLDS(CQ_OFF_PHYS_OFFSET == 0 && CQ_OFF_SIZE == 8 && CQ_OFF_TAG_HASH == 12 && CQ_ENTRY_BYTES == 20);

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

/* attribute names (ReadState.names) */
enum {
    N_STOPPED_AT, N_QUEUES, N_START, N_CURSOR, N_MAX_BYTES, N_LIMIT, N_CAPPED, N_CL, N_SCAN_ERROR,
    N_READABLE_END, N_CQ_REFRESHED, N_COMMITLOG, N_MFQ, N_FILES, N_FILE_FROM_OFFSET, N_FILE_BYTES,
    N_COMMITTED_POS, N_MM, N_SHOWN, N_REFRESH_CQ, N_SHOWN_END, N_COUNT
};
static const char *const NAME_TEXT[N_COUNT] = {
    "stopped_at", "queues", "start", "cursor", "max_bytes", "limit", "capped", "cl", "scan_error",
    "readable_end", "_cq_refreshed", "commitlog", "mfq", "files", "file_from_offset", "file_bytes",
    "committed_pos", "mm", "_shown", "_refresh_cq", "_shown_end"
};

typedef struct {
    PyTypeObject *msg_cls;                  /* hostmq.message.MessageExt, NULL until bound */
    PyObject *cq_dtype;                     /* records.CQ_ENTRY */
    Py_ssize_t raw_off, broker_off;         /* where its ``_raw`` and ``broker`` slots live */
    Py_ssize_t none_off[MAX_NONE_SLOTS];    /* the slots its __init__ sets to None */
    int n_none;
    uint32_t compressed_flag;               /* records.SYSFLAG_COMPRESSED */
    PyTypeObject *tq_type;                  /* TailQueues (a heap type of this module) */
    PyObject *names[N_COUNT];               /* the attribute names tail_read and tail_poll use, interned */
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
/* take()'s work over ``count`` CQ_ENTRY rows at ``e`` (held by the caller for the call). */
/* What a take answers: (next, reason, nbytes, removed). */
typedef struct {
    int64_t next, nbytes, removed;
    int reason;
} TakeOut;

/* Below this many entries a take keeps the GIL: releasing and taking it back costs more than the check. */
#define TAKE_NOGIL_MIN 64

static int take_rows_c(ReadState *st, const unsigned char *e, int64_t count, int64_t first, PyObject *mm_obj,
                       int64_t file_from, int64_t file_end, int64_t cl_min, int64_t qoff0, PyObject *topic_b,
                       int64_t queue_id, int64_t max_bytes, int64_t nbytes, PyObject *broker, PyObject *out,
                       TakeOut *res);

static PyObject *take_rows(ReadState *st, const unsigned char *e, int64_t count, int64_t first, PyObject *mm_obj,
                           int64_t file_from, int64_t file_end, int64_t cl_min, int64_t qoff0, PyObject *topic_b,
                           int64_t queue_id, int64_t max_bytes, int64_t nbytes, PyObject *broker, PyObject *out)
{
    TakeOut o;
    if (take_rows_c(st, e, count, first, mm_obj, file_from, file_end, cl_min, qoff0, topic_b, queue_id, max_bytes,
                    nbytes, broker, out, &o) < 0)
        return NULL;
    return Py_BuildValue("(LiLL)", (long long)o.next, o.reason, (long long)o.nbytes, (long long)o.removed);
}

static int take_rows_c(ReadState *st, const unsigned char *e, int64_t count, int64_t first, PyObject *mm_obj,
                       int64_t file_from, int64_t file_end, int64_t cl_min, int64_t qoff0, PyObject *topic_b,
                       int64_t queue_id, int64_t max_bytes, int64_t nbytes, PyObject *broker, PyObject *out,
                       TakeOut *res)
{
    if (!PyList_Check(out) || !PyBytes_Check(topic_b)) {
        PyErr_SetString(PyExc_TypeError, "take(): topic_b must be bytes and out a list");
        return -1;
    }
    const unsigned char *topic = (const unsigned char *)PyBytes_AS_STRING(topic_b);
    int64_t tlen = PyBytes_GET_SIZE(topic_b);
    Py_buffer mm = {0};
    int have_mm = mm_obj != Py_None;
    if (have_mm && get_buffer(mm_obj, &mm, "mm") < 0)
        return -1;
    if (!have_mm)
        file_from = file_end = 0;
    if (first < 0 || first > count) {
        if (have_mm) PyBuffer_Release(&mm);
        PyErr_SetString(PyExc_ValueError, "take(): entries are not CQ_ENTRY rows, or first is outside them");
        return -1;
    }
    Taken *ok = count > first ? malloc(sizeof(Taken) * (size_t)(count - first)) : NULL;
    if (count > first && ok == NULL) {
        if (have_mm) PyBuffer_Release(&mm);
        PyErr_NoMemory();
        return -1;
    }
    const unsigned char *b = have_mm ? mm.buf : NULL;
    int64_t blen = have_mm ? mm.len : 0;
    int have = PyList_GET_SIZE(out) > 0;
    int64_t i = first, n_ok = 0, removed = 0;
    int reason = TAKE_DONE;
    uint32_t cflag = st->compressed_flag;
    PyThreadState *ts = count - first >= TAKE_NOGIL_MIN ? PyEval_SaveThread() : NULL;
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
    if (ts != NULL)
        PyEval_RestoreThread(ts);
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
        *res = (TakeOut){i, nbytes, removed, reason};
    free(ok);
    if (have_mm)
        PyBuffer_Release(&mm);
    return failed ? -1 : 0;
}

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
    Py_buffer ents;
    if (get_entries(st, args[0], &ents) < 0)
        return NULL;
    if (ents.len % CQ_ENTRY_BYTES) {
        PyBuffer_Release(&ents);
        PyErr_SetString(PyExc_ValueError, "take(): entries are not CQ_ENTRY rows, or first is outside them");
        return NULL;
    }
    PyObject *result = take_rows(st, ents.buf, ents.len / CQ_ENTRY_BYTES, first, args[2], file_from, file_end, cl_min,
                                 qoff0, args[7], queue_id, max_bytes, nbytes, args[11], args[12]);
    PyBuffer_Release(&ents);
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

/* cq_readable(mm, pos, end, limit) -> pos: the scalar look of readonly.py ``readable_entries`` (the
 * spec) at the new entries of a consume-queue file a dispatcher in another process is appending to:
 * from ``pos`` (an entry boundary), entry by entry up to ``end``, while an entry's size is > 0 and its
 * record ends by ``limit`` — its size loaded before its phys offset and once more after, the order that
 * tells a whole entry from one being stored (see the spec) — the boundary after the last such entry. */
static inline int64_t vbe32(const volatile unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

static inline int64_t vbe64(const volatile unsigned char *p)
{
    return (int64_t)(((uint64_t)(uint32_t)vbe32(p) << 32) | (uint32_t)vbe32(p + 4));
}

static PyObject *cq_readable(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    int64_t pos, end, limit;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "cq_readable() takes 4 arguments");
        return NULL;
    }
    if (get_i64(args[1], &pos) < 0 || get_i64(args[2], &end) < 0 || get_i64(args[3], &limit) < 0)
        return NULL;
    Py_buffer mm;
    if (get_buffer(args[0], &mm, "mm") < 0)
        return NULL;
    if (end > mm.len)
        end = mm.len;
    const volatile unsigned char *b = mm.buf;
    while (pos >= 0 && pos + CQ_ENTRY_BYTES <= end) {
        int64_t size = vbe32(b + pos + CQ_OFF_SIZE);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        int64_t phys = vbe64(b + pos + CQ_OFF_PHYS_OFFSET);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (size <= 0 || phys > limit - size || vbe32(b + pos + CQ_OFF_SIZE) != size)
            break;
        pos += CQ_ENTRY_BYTES;
    }
    PyBuffer_Release(&mm);
    return PyLong_FromLongLong(pos);
}

/* ---- TailQueues: a tail's entries per queue ----------------------------------------------------------
 *
 * What store/tail.py's ``PyTailQueues`` (the spec: a dict of deques) holds, per (topic, queue id): the
 * consume-queue entries of the records the tail scanned, oldest first — each entry's queue offset and
 * its CQ_ENTRY row (phys offset, size, tag code; big-endian, as a consume-queue file stores it), so
 * ``rows`` hands a run of them to take() / batch_rows() as one bytes object. The dict maps
 * ``(topic, queue_id)`` to a capsule of a TQ; a queue with no entry left is removed, as the spec
 * removes an empty deque. tail_scan() appends the records it decides straight into it.
 * tests/store/test_tail_native.py drives both with the same operations and compares them after each. */
typedef struct {
    int64_t *qoff;                          /* the entries' queue offsets */
    unsigned char *rows;                    /* their CQ_ENTRY rows */
    Py_ssize_t head, len, cap;              /* live entries: [head, head + len) */
} TQ;

#define TQ_CAPSULE "hostmq.store._read.TQ"

typedef struct {
    PyObject_HEAD
    PyObject *queues;                       /* dict: (topic, queue_id) -> capsule of a TQ */
} TailQueuesObject;

static inline void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void put_be64(unsigned char *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static void tq_free(PyObject *capsule)
{
    TQ *q = PyCapsule_GetPointer(capsule, TQ_CAPSULE);
    if (q != NULL) {
        free(q->qoff);
        free(q->rows);
        free(q);
    }
}

/* The TQ of ``key`` (NULL, no error set: none and ``create`` is 0; NULL with an error: failed). */
static TQ *tq_lookup(TailQueuesObject *self, PyObject *key, int create)
{
    PyObject *c = PyDict_GetItemWithError(self->queues, key);
    if (c != NULL)
        return PyCapsule_GetPointer(c, TQ_CAPSULE);
    if (PyErr_Occurred() || !create)
        return NULL;
    TQ *q = calloc(1, sizeof(TQ));
    if (q == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    c = PyCapsule_New(q, TQ_CAPSULE, tq_free);
    if (c == NULL) {
        free(q);
        return NULL;
    }
    int rc = PyDict_SetItem(self->queues, key, c);
    Py_DECREF(c);           /* the dict holds it (or, on failure, it freed the TQ) */
    return rc < 0 ? NULL : q;
}

static int tq_append(TQ *q, int64_t qoff, int64_t phys, int64_t size, int64_t tag)
{
    if (q->head + q->len == q->cap) {
        if (q->head > 0 && q->head >= q->cap / 2) {     /* dropped entries make room: move the rest down */
            memmove(q->qoff, q->qoff + q->head, (size_t)q->len * sizeof(int64_t));
            memmove(q->rows, q->rows + q->head * CQ_ENTRY_BYTES, (size_t)q->len * CQ_ENTRY_BYTES);
            q->head = 0;
        } else {
            Py_ssize_t cap = q->cap ? q->cap * 2 : 16;
            int64_t *qo = realloc(q->qoff, (size_t)cap * sizeof(int64_t));
            if (qo == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            q->qoff = qo;
            unsigned char *r = realloc(q->rows, (size_t)cap * CQ_ENTRY_BYTES);
            if (r == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            q->rows = r;
            q->cap = cap;
        }
    }
    Py_ssize_t i = q->head + q->len;
    unsigned char *row = q->rows + i * CQ_ENTRY_BYTES;
    q->qoff[i] = qoff;
    put_be64(row + CQ_OFF_PHYS_OFFSET, (uint64_t)phys);
    put_be32(row + CQ_OFF_SIZE, (uint32_t)size);
    put_be64(row + CQ_OFF_TAG_HASH, (uint64_t)tag);
    q->len++;
    return 0;
}

static inline int64_t tq_phys(const TQ *q, Py_ssize_t i)
{
    return (int64_t)be64(q->rows + i * CQ_ENTRY_BYTES + CQ_OFF_PHYS_OFFSET);
}

static PyObject *tq_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "TailQueues() takes no arguments");
        return NULL;
    }
    TailQueuesObject *self = (TailQueuesObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->queues = PyDict_New();
    if (self->queues == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int tq_traverse(TailQueuesObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->queues);
    return 0;
}

static int tq_clear_refs(TailQueuesObject *self)
{
    Py_CLEAR(self->queues);
    return 0;
}

static void tq_dealloc(TailQueuesObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    tq_clear_refs(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static Py_ssize_t tq_length(TailQueuesObject *self) { return PyDict_GET_SIZE(self->queues); }

static int get_key_args(PyObject *const *args, int64_t *qid)
{
    if (!PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "topic must be a str");
        return -1;
    }
    return get_i64(args[1], qid);
}

/* extend(rows): append (topic, queue_id, queue_offset, phys, size, tag code) rows, as the spec
 * appends the rows of store/tail.py scan() to its deques. */
static PyObject *tq_extend(TailQueuesObject *self, PyObject *rows)
{
    PyObject *it = PyObject_GetIter(rows);
    if (it == NULL)
        return NULL;
    PyObject *row;
    while ((row = PyIter_Next(it)) != NULL) {
        int64_t v[5];
        int bad = !PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 6 || !PyUnicode_Check(PyTuple_GET_ITEM(row, 0));
        for (int k = 0; !bad && k < 5; k++)
            bad = get_i64(PyTuple_GET_ITEM(row, k + 1), &v[k]) < 0;
        if (!bad && (v[3] < INT32_MIN || v[3] > INT32_MAX)) {
            PyErr_SetString(PyExc_OverflowError, "TailQueues.extend(): a size past an i32");
            bad = 1;
        }
        if (bad) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "TailQueues.extend(): rows of (topic, queue_id, queue_offset, "
                                                 "phys, size, tag) expected");
            Py_DECREF(row);
            Py_DECREF(it);
            return NULL;
        }
        PyObject *key = PyTuple_GetSlice(row, 0, 2);
        TQ *q = key == NULL ? NULL : tq_lookup(self, key, 1);
        Py_XDECREF(key);
        Py_DECREF(row);
        if (q == NULL || tq_append(q, v[1], v[2], v[3], v[4]) < 0) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* drop_below(phys): drop each queue's first entries whose record starts below ``phys`` (the
 * dispatcher covered them) and the queues left with none. */
static PyObject *tq_drop_below(TailQueuesObject *self, PyObject *arg)
{
    int64_t below;
    if (get_i64(arg, &below) < 0)
        return NULL;
    PyObject *empty = NULL, *key, *c;
    Py_ssize_t pos = 0;
    while (PyDict_Next(self->queues, &pos, &key, &c)) {
        TQ *q = PyCapsule_GetPointer(c, TQ_CAPSULE);
        if (q == NULL)
            goto fail;
        while (q->len && tq_phys(q, q->head) < below) {
            q->head++;
            q->len--;
        }
        if (q->len == 0) {
            q->head = 0;
            if (empty == NULL && (empty = PyList_New(0)) == NULL)
                goto fail;
            if (PyList_Append(empty, key) < 0)
                goto fail;
        }
    }
    for (Py_ssize_t k = 0; empty != NULL && k < PyList_GET_SIZE(empty); k++)
        if (PyDict_DelItem(self->queues, PyList_GET_ITEM(empty, k)) < 0)
            goto fail;
    Py_XDECREF(empty);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(empty);
    return NULL;
}

static PyObject *tq_clear(TailQueuesObject *self, PyObject *unused)
{
    (void)unused;
    PyDict_Clear(self->queues);
    Py_RETURN_NONE;
}

static TQ *tq_of(TailQueuesObject *self, PyObject *const *args, int must)
{
    int64_t qid;
    if (get_key_args(args, &qid) < 0)
        return NULL;
    PyObject *key = PyTuple_Pack(2, args[0], args[1]);
    if (key == NULL)
        return NULL;
    TQ *q = tq_lookup(self, key, 0);
    if (q == NULL && must && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, key);
    Py_DECREF(key);
    return q;
}

/* count_after's answer for a queue's entries (``q`` may be NULL: none). */
static int64_t tq_run(const TQ *q, int64_t cq_max)
{
    if (q == NULL || q->len == 0 || q->qoff[q->head] != cq_max)
        return 0;
    Py_ssize_t n = q->len;
    if (q->qoff[q->head + n - 1] != cq_max + n - 1) {       /* not one run: count the run from cq_max */
        Py_ssize_t k = 0;
        while (k < n && q->qoff[q->head + k] == cq_max + k)
            k++;
        n = k;
    }
    return n;
}

/* take_rows over a copy of up to ``count`` of ``q``'s rows from its ``i``-th entry (read as queue
 * offset ``from``): the queues may change while take_rows runs without the GIL. */
static int tq_take_copy_c(ReadState *st, const TQ *q, int64_t i, int64_t count, int64_t from, PyObject *mm,
                          int64_t file_from, int64_t file_end, int64_t cl_min, PyObject *topic_b, int64_t queue_id,
                          int64_t max_bytes, int64_t nbytes, PyObject *broker, PyObject *out, TakeOut *res)
{
    int64_t n = i >= q->len ? 0 : (count < q->len - i ? count : q->len - i);
    unsigned char small[16 * CQ_ENTRY_BYTES];           /* (a round's few rows: no malloc) */
    unsigned char *rows = n <= 16 ? small : malloc((size_t)n * CQ_ENTRY_BYTES);
    if (rows == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(rows, q->rows + (q->head + i) * CQ_ENTRY_BYTES, (size_t)n * CQ_ENTRY_BYTES);
    int rc = take_rows_c(st, rows, n, 0, mm, file_from, file_end, cl_min, from, topic_b, queue_id, max_bytes, nbytes,
                         broker, out, res);
    if (rows != small)
        free(rows);
    return rc;
}

static PyObject *tq_take_copy(ReadState *st, const TQ *q, int64_t i, int64_t count, int64_t from, PyObject *mm,
                              int64_t file_from, int64_t file_end, int64_t cl_min, PyObject *topic_b, int64_t queue_id,
                              int64_t max_bytes, int64_t nbytes, PyObject *broker, PyObject *out)
{
    TakeOut o;
    if (tq_take_copy_c(st, q, i, count, from, mm, file_from, file_end, cl_min, topic_b, queue_id, max_bytes, nbytes,
                       broker, out, &o) < 0)
        return NULL;
    return Py_BuildValue("(LiLL)", (long long)o.next, o.reason, (long long)o.nbytes, (long long)o.removed);
}

/* count_after(topic, queue_id, cq_max): how many of the queue's entries continue a consume queue
 * that ends at ``cq_max`` (queue offsets consecutive from it) — the spec's count_after. */
static PyObject *tq_count_after(TailQueuesObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t cq_max;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "count_after() takes 3 arguments");
        return NULL;
    }
    if (get_i64(args[2], &cq_max) < 0)
        return NULL;
    TQ *q = tq_of(self, args, 0);
    if (q == NULL && PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(tq_run(q, cq_max));
}

/* rows(topic, queue_id, from_offset, count) -> bytes: the CQ_ENTRY rows of up to ``count`` entries
 * from the one read as ``from_offset`` (the first entry's queue offset plus its index, as the spec
 * indexes its deque); KeyError for a queue with none, ValueError for an offset before the first. */
static PyObject *tq_rows(TailQueuesObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t from, count;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "rows() takes 4 arguments");
        return NULL;
    }
    if (get_i64(args[2], &from) < 0 || get_i64(args[3], &count) < 0)
        return NULL;
    TQ *q = tq_of(self, args, 1);
    if (q == NULL)
        return NULL;
    int64_t i = from - q->qoff[q->head];
    if (i < 0 || count < 0) {
        PyErr_SetString(PyExc_ValueError, "rows(): an offset before the queue's first tail entry, or a negative count");
        return NULL;
    }
    int64_t n = i >= q->len ? 0 : (count < q->len - i ? count : q->len - i);
    return PyBytes_FromStringAndSize((const char *)(q->rows + (q->head + i) * CQ_ENTRY_BYTES),
                                     (Py_ssize_t)(n * CQ_ENTRY_BYTES));
}

/* take(topic, queue_id, from_offset, count, mm, file_from, file_end, cl_min, topic_b, max_bytes, nbytes,
 *      broker, out) -> (next, reason, nbytes, removed): take() over ``rows(topic, queue_id,
 * from_offset, count)`` without building them (a copy of the rows is checked, so the queues may change
 * meanwhile); ``next`` counts from ``from_offset``. */
static PyObject *tq_take(TailQueuesObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    ReadState *st = PyType_GetModuleState(Py_TYPE(self));
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "take() takes 13 arguments");
        return NULL;
    }
    if (st == NULL || need_bound(st) < 0)
        return NULL;
    int64_t from, count, file_from, file_end, cl_min, queue_id, max_bytes, nbytes;
    if (get_i64(args[1], &queue_id) < 0 || get_i64(args[2], &from) < 0 || get_i64(args[3], &count) < 0 ||
        get_i64(args[5], &file_from) < 0 || get_i64(args[6], &file_end) < 0 || get_i64(args[7], &cl_min) < 0 ||
        get_i64(args[9], &max_bytes) < 0 || get_i64(args[10], &nbytes) < 0)
        return NULL;
    TQ *q = tq_of(self, args, 1);
    if (q == NULL)
        return NULL;
    int64_t i = from - q->qoff[q->head];
    if (i < 0 || count < 0) {
        PyErr_SetString(PyExc_ValueError, "take(): an offset before the queue's first tail entry, or a negative count");
        return NULL;
    }
    return tq_take_copy(st, q, i, count, from, args[4], file_from, file_end, cl_min, args[8], queue_id, max_bytes,
                        nbytes, args[11], args[12]);
}

/* entries(topic, queue_id) -> [(queue_offset, phys, size, tag), ...] (what the spec's deque holds). */
static PyObject *tq_entries(TailQueuesObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "entries() takes 2 arguments");
        return NULL;
    }
    TQ *q = tq_of(self, args, 1);
    if (q == NULL)
        return NULL;
    PyObject *out = PyList_New(q->len);
    for (Py_ssize_t k = 0; out != NULL && k < q->len; k++) {
        const unsigned char *row = q->rows + (q->head + k) * CQ_ENTRY_BYTES;
        PyObject *t = Py_BuildValue("(LLiL)", (long long)q->qoff[q->head + k],
                                    (long long)be64(row + CQ_OFF_PHYS_OFFSET), (int)(int32_t)be32(row + CQ_OFF_SIZE),
                                    (long long)be64(row + CQ_OFF_TAG_HASH));
        if (t == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, k, t);
    }
    return out;
}

static PyObject *tq_keys(TailQueuesObject *self, PyObject *unused)
{
    (void)unused;
    return PyDict_Keys(self->queues);
}

static PyMethodDef tq_methods[] = {
    {"extend", (PyCFunction)tq_extend, METH_O, "Append (topic, queue_id, queue_offset, phys, size, tag) rows."},
    {"drop_below", (PyCFunction)tq_drop_below, METH_O, "Drop entries whose record starts below a phys offset."},
    {"clear", (PyCFunction)tq_clear, METH_NOARGS, "Drop every entry."},
    {"count_after", (PyCFunction)(void (*)(void))tq_count_after, METH_FASTCALL,
     "count_after(topic, queue_id, cq_max): entries continuing a consume queue ending at cq_max."},
    {"rows", (PyCFunction)(void (*)(void))tq_rows, METH_FASTCALL,
     "rows(topic, queue_id, from_offset, count) -> bytes of CQ_ENTRY rows."},
    {"take", (PyCFunction)(void (*)(void))tq_take, METH_FASTCALL,
     "take(topic, queue_id, from_offset, count, mm, ...): _read.take over the queue's rows from from_offset."},
    {"entries", (PyCFunction)(void (*)(void))tq_entries, METH_FASTCALL,
     "entries(topic, queue_id) -> [(queue_offset, phys, size, tag)]."},
    {"keys", (PyCFunction)tq_keys, METH_NOARGS, "The (topic, queue_id) of every queue with entries."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot tq_slots[] = {
    {Py_tp_doc, "A tail's consume-queue entries per queue (store/tail.py PyTailQueues is the spec)."},
    {Py_tp_new, tq_new},
    {Py_tp_dealloc, tq_dealloc},
    {Py_tp_traverse, tq_traverse},
    {Py_tp_clear, tq_clear_refs},
    {Py_tp_methods, tq_methods},
    {Py_mp_length, tq_length},
    {0, NULL},
};

static PyType_Spec tq_spec = {
    .name = "hostmq.store._read.TailQueues",
    .basicsize = sizeof(TailQueuesObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = tq_slots,
};

/* tail_scan(mm, rel, end, base, max_records, max_topic, skip_topic, out) -> (rel, status, counted): the common
 * case of store/tail.py's scan (dispatch.scan_records, the spec) over one mapped commitlog file:
 * records from ``rel`` while they end by ``end``, each checked as records_checks.sound_at checks it,
 * at most ``max_records`` kept. For each record it appends (topic, queue_id, queue_offset, phys,
 * size, tag code) to the list ``out`` — the consume-queue entry the dispatcher will write; ``out`` a
 * TailQueues: the entry goes straight into it, as its ``extend`` would put that row — except
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

/* One record of tail_scan at ``rel`` (before ``end``): 0 and what its consume-queue entry needs, or 1:
 * a record this module does not decide alone (the spec reads it). */
typedef struct {
    int64_t total, qid, qoff, code;
    const unsigned char *topic;
    int64_t tlen;
    int skip;                               /* the skip topic's (counted, not kept) */
} ScanRec;

static int scan_record(const unsigned char *b, int64_t rel, int64_t end, int64_t base, int64_t max_topic,
                       const unsigned char *skip, Py_ssize_t skip_len, ScanRec *o)
{
    static const unsigned char tags_name[] = "\x02TAGS\x01";
    const int64_t tn = (int64_t)sizeof tags_name - 1;
    if (rel < 0 || rel + HDR_BYTES > end)
        return 1;                                       /* a blank, or broken: the spec */
    const unsigned char *r = b + rel;
    int64_t total = (int32_t)be32(r + OFF_TOTAL_SIZE), blen = (int32_t)be32(r + OFF_BODY_LENGTH);
    int64_t qid = (int32_t)be32(r + OFF_QUEUE_ID), qoff = (int64_t)be64(r + OFF_QUEUE_OFFSET);
    if (be32(r + OFF_MAGIC) != MAGIC_CODE || total < MIN_RECORD_BYTES || total > end - rel ||
        (int64_t)be64(r + OFF_PHYS_OFFSET) != base + rel || qid < 0 || qoff < 0 || blen < 0 ||
        blen > total - MIN_RECORD_BYTES)
        return 1;
    int64_t tpos = HDR_BYTES + blen, tlen = r[tpos], ppos = tpos + TOPIC_LEN_BYTES + tlen, stop = total;
    if (ppos + PROPS_LEN_BYTES > stop)
        return 1;
    int64_t plen = (r[ppos] << 8) | r[ppos + 1], pstart = ppos + PROPS_LEN_BYTES;
    if (pstart + plen != stop || (plen && r[stop - 1] != PROPERTY_END))
        return 1;
    const unsigned char *t = r + tpos + TOPIC_LEN_BYTES;
    int valid = tlen >= 1 && tlen <= max_topic;
    for (int64_t i = 0; valid && i < tlen; i++)
        valid = topic_char_ok(t[i]);
    if (!valid)
        return 1;                                       /* the spec skips it, counts and logs it */
    *o = (ScanRec){total, qid, qoff, 0, t, tlen, tlen == skip_len && memcmp(t, skip, (size_t)tlen) == 0};
    if (o->skip)
        return 0;
    /* TAGS as dispatch._prop finds it: the first "\x02TAGS\x01" in "\x02" + properties, up to the next \x02 */
    int64_t found = -1;
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
        if (!ascii)
            return 1;                                   /* decoded with replacement characters: the spec */
        o->code = (int32_t)h;
    }
    return 0;
}

/* Appends scanned records to ``tq``, decoding each topic once per run of equal topics. */
typedef struct {
    PyObject *topic;
    const unsigned char *t;
    int64_t tlen, qid;
    TQ *q;
} ScanInto;

/* ``c->topic``: the record's topic as a str (decoded again only when it differs from the last one). */
static int scan_topic(ScanInto *c, const ScanRec *o)
{
    if (c->topic == NULL || o->tlen != c->tlen || memcmp(o->topic, c->t, (size_t)o->tlen) != 0) {
        Py_XDECREF(c->topic);
        c->topic = PyUnicode_DecodeASCII((const char *)o->topic, o->tlen, NULL);
        if (c->topic == NULL)
            return -1;
        c->t = o->topic;
        c->tlen = o->tlen;
        c->q = NULL;
    }
    return 0;
}

static int scan_append(TailQueuesObject *tq, ScanInto *c, const ScanRec *o, int64_t phys)
{
    if (scan_topic(c, o) < 0)
        return -1;
    if (c->q == NULL || o->qid != c->qid) {
        PyObject *key = Py_BuildValue("(OL)", c->topic, (long long)o->qid);
        c->q = key == NULL ? NULL : tq_lookup(tq, key, 1);
        Py_XDECREF(key);
        c->qid = o->qid;
        if (c->q == NULL)
            return -1;
    }
    return tq_append(c->q, o->qoff, phys, o->total, o->code);
}

static PyObject *tail_scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ReadState *st = state_of(module);
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "tail_scan() takes 8 arguments");
        return NULL;
    }
    int64_t rel, end, base, max_records, max_topic;
    if (get_i64(args[1], &rel) < 0 || get_i64(args[2], &end) < 0 || get_i64(args[3], &base) < 0 ||
        get_i64(args[4], &max_records) < 0 || get_i64(args[5], &max_topic) < 0)
        return NULL;
    int into = st->tq_type != NULL && PyObject_TypeCheck(args[7], st->tq_type);
    if (!PyBytes_Check(args[6]) || !(into || PyList_Check(args[7]))) {
        PyErr_SetString(PyExc_TypeError, "tail_scan(): skip_topic must be bytes and out a list or a TailQueues");
        return NULL;
    }
    Py_buffer mm;
    if (get_buffer(args[0], &mm, "mm") < 0)
        return NULL;
    const unsigned char *b = mm.buf, *skip = (const unsigned char *)PyBytes_AS_STRING(args[6]);
    Py_ssize_t skip_len = PyBytes_GET_SIZE(args[6]);
    PyObject *out = args[7];
    ScanInto c = {0};
    int64_t kept = 0;
    int status = 0;
    if (end > mm.len)
        end = mm.len;
    while (rel < end && kept < max_records) {
        ScanRec o;
        if (scan_record(b, rel, end, base, max_topic, skip, skip_len, &o)) {
            status = 1;
            break;
        }
        if (!o.skip) {
            if (into) {
                if (scan_append((TailQueuesObject *)out, &c, &o, base + rel) < 0) {
                    status = -1;
                    break;
                }
            } else {
                if (scan_topic(&c, &o) < 0) {
                    status = -1;
                    break;
                }
                PyObject *row = Py_BuildValue("(OLLLLL)", c.topic, (long long)o.qid, (long long)o.qoff,
                                              (long long)(base + rel), (long long)o.total, (long long)o.code);
                if (row == NULL || PyList_Append(out, row) < 0) {
                    Py_XDECREF(row);
                    status = -1;
                    break;
                }
                Py_DECREF(row);
            }
        }
        kept++;                                 /* the skip topic's counted as the spec counts it */
        rel += o.total;
    }
    Py_XDECREF(c.topic);
    PyBuffer_Release(&mm);
    if (status < 0)
        return NULL;
    return Py_BuildValue("(LiL)", (long long)rel, status, (long long)kept);
}

/* tail_read(tail, dispatched, stored, mm, file_from, file_bytes, committed, topic, queue_id, cq_max,
 *           queue_offset, max_count, cl_min, topic_b, max_bytes, broker, out, skip_topic, max_topic,
 *           max_records) -> None, or (hi, next, reason, removed)
 *
 * A tailing consumer's round after its consume-queue refresh, in one call: store/tail.py
 * ``CommitlogTail.advance(dispatched, stored)`` (the spec) where its scan stays in the commitlog file
 * ``mm`` maps (the newest, from ``file_from``; ``committed`` as its ``committed_pos``) and tail_scan
 * decides every record alone — then ``count_after(topic, queue_id, cq_max)``, whose ``cq_max +``
 * is ``hi``, and, when ``cq_max <= queue_offset < hi``, take() over the queue's entries from
 * ``queue_offset`` (``reason`` -1: not read). None: the case is not that one, and nothing changed —
 * a stopped tail, a scan that leaves the file or meets a record for the spec; the caller runs the
 * spec. ``tail``'s attributes (start, cursor, limit, capped, stopped_at, max_bytes, queues, and
 * cl.scan_error after a scan) are read and set as the spec sets them; the scan is made into a
 * scratch first and applied only once it is known to be the spec's whole answer. */
typedef struct {
    int64_t phys;
    ScanRec o;
} Scanned;

static int get_attr_i64(ReadState *st, PyObject *o, int name, int64_t *v)
{
    PyObject *x = PyObject_GetAttr(o, st->names[name]);
    if (x == NULL)
        return -1;
    int rc = get_i64(x, v);
    Py_DECREF(x);
    return rc;
}

static int set_attr_i64(ReadState *st, PyObject *o, int name, int64_t v)
{
    PyObject *x = PyLong_FromLongLong(v);
    if (x == NULL)
        return -1;
    int rc = PyObject_SetAttr(o, st->names[name], x);
    Py_DECREF(x);
    return rc;
}

/* What tail_read answers: (hi, next, reason, removed). */
typedef struct {
    int64_t hi, next, removed;
    int reason;
} TailOut;

/* tail_read's work on parsed arguments (tail_poll calls it too): the objects are borrowed. -1: an
 * error; 0: not this call's case (tail_read's None, the spec's); 1: ``*res`` holds the answer. */
static int tail_read_c(ReadState *st, PyObject *tail, int64_t dispatched, int64_t stored, PyObject *mm_obj,
                       int64_t file_from, int64_t file_bytes, int64_t committed, PyObject *topic, PyObject *qid_obj,
                       int64_t qid, int64_t cq_max, int64_t pos, int64_t max_count, int64_t cl_min, PyObject *topic_b,
                       int64_t max_bytes, PyObject *broker, PyObject *msgs, PyObject *skip_topic, int64_t max_topic,
                       int64_t max_records, TailOut *res)
{
    int64_t start, cursor, tail_max;
    PyObject *stopped = PyObject_GetAttr(tail, st->names[N_STOPPED_AT]);
    if (stopped == NULL)
        return -1;
    int is_stopped = stopped != Py_None;
    Py_DECREF(stopped);
    PyObject *queues = PyObject_GetAttr(tail, st->names[N_QUEUES]);
    if (queues == NULL)
        return -1;
    if (is_stopped || !PyObject_TypeCheck(queues, st->tq_type)) {
        Py_DECREF(queues);
        return 0;                                       /* a stopped tail, the spec's queues: the spec */
    }
    TailQueuesObject *tq = (TailQueuesObject *)queues;
    int result = -1;
    Scanned *sc = NULL;
    Py_buffer mm = {0};
    int have_mm = 0;
    if (get_attr_i64(st, tail, N_START, &start) < 0 || get_attr_i64(st, tail, N_CURSOR, &cursor) < 0 ||
        get_attr_i64(st, tail, N_MAX_BYTES, &tail_max) < 0)
        goto done;
    /* advance's arithmetic, on locals */
    int clear = 0, drop = 0;
    int64_t new_start = start, new_cursor = cursor;
    if (dispatched > start) {
        new_start = dispatched;
        if (dispatched >= cursor) {
            new_cursor = dispatched;
            clear = 1;
        } else {
            drop = 1;
        }
    }
    int64_t limit = stored < new_start + tail_max ? stored : new_start + tail_max;
    int capped = stored > limit;
    int64_t n_sc = 0, next = new_cursor;
    if (new_cursor < limit) {
        /* the scan, into the scratch: only where it stays in this file and ends as the spec's would */
        if (!(file_from <= new_cursor && limit <= file_from + file_bytes) || max_records <= 0) {
            result = 0;
            goto done;
        }
        if (get_buffer(mm_obj, &mm, "mm") < 0)
            goto done;
        have_mm = 1;
        sc = malloc(sizeof(Scanned) * (size_t)(max_records < 64 ? max_records : 64));
        int64_t cap = max_records < 64 ? max_records : 64;
        if (sc == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        int64_t rel = new_cursor - file_from, end = committed < limit - file_from ? committed : limit - file_from;
        if (end > mm.len)
            end = mm.len;
        const unsigned char *skip = (const unsigned char *)PyBytes_AS_STRING(skip_topic);
        Py_ssize_t skip_len = PyBytes_GET_SIZE(skip_topic);
        int64_t kept = 0;
        int status = 0;
        while (rel < end && kept < max_records) {
            ScanRec o;
            if (scan_record(mm.buf, rel, end, file_from, max_topic, skip, skip_len, &o)) {
                status = 1;
                break;
            }
            if (!o.skip) {
                if (n_sc == cap) {
                    int64_t ncap = cap * 2 < max_records ? cap * 2 : max_records;
                    Scanned *g = realloc(sc, sizeof(Scanned) * (size_t)ncap);
                    if (g == NULL) {
                        PyErr_NoMemory();
                        goto done;
                    }
                    sc = g;
                    cap = ncap;
                }
                sc[n_sc++] = (Scanned){file_from + rel, o};
            }
            kept++;
            rel += o.total;
        }
        if (status || !(kept >= max_records || file_from + rel >= limit)) {
            result = 0;                                 /* the spec goes on from here: leave it all to it */
            goto done;
        }
        next = file_from + rel;
    }
    /* apply: what the dispatcher covered, the scanned entries, the tail's words */
    if (clear)
        PyDict_Clear(tq->queues);
    else if (drop) {
        PyObject *arg = PyLong_FromLongLong(new_start), *r = arg == NULL ? NULL : tq_drop_below(tq, arg);
        Py_XDECREF(arg);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    ScanInto c = {0};
    for (int64_t k = 0; k < n_sc; k++)
        if (scan_append(tq, &c, &sc[k].o, sc[k].phys) < 0) {
            Py_XDECREF(c.topic);
            goto done;
        }
    Py_XDECREF(c.topic);
    if (set_attr_i64(st, tail, N_START, new_start) < 0 || set_attr_i64(st, tail, N_LIMIT, limit) < 0 ||
        PyObject_SetAttr(tail, st->names[N_CAPPED], capped ? Py_True : Py_False) < 0)
        goto done;
    if (new_cursor < limit) {                           /* it scanned: scan_into's and advance's last words */
        PyObject *cl = PyObject_GetAttr(tail, st->names[N_CL]);
        int rc = cl == NULL ? -1 : PyObject_SetAttr(cl, st->names[N_SCAN_ERROR], Py_None);
        Py_XDECREF(cl);
        if (rc < 0 || set_attr_i64(st, tail, N_CURSOR, next > new_cursor ? next : new_cursor) < 0)
            goto done;
    } else if (new_cursor != cursor && set_attr_i64(st, tail, N_CURSOR, new_cursor) < 0)
        goto done;
    /* count_after, then take() over the queue's entries from queue_offset */
    PyObject *key = PyTuple_Pack(2, topic, qid_obj);
    if (key == NULL)
        goto done;
    TQ *q = tq_lookup(tq, key, 0);
    Py_DECREF(key);
    if (q == NULL && PyErr_Occurred())
        goto done;
    int64_t hi = cq_max + tq_run(q, cq_max);
    if (!(cq_max <= pos && pos < hi && max_count >= 1)) {
        *res = (TailOut){hi, 0, 0, -1};
        result = 1;
        goto done;
    }
    TakeOut took;
    if (tq_take_copy_c(st, q, pos - q->qoff[q->head], max_count < hi - pos ? max_count : hi - pos, pos, mm_obj,
                       file_from, file_from + file_bytes, cl_min, topic_b, qid, max_bytes, 0, broker, msgs, &took) < 0)
        goto done;
    *res = (TailOut){hi, took.next, took.removed, took.reason};
    result = 1;
done:
    free(sc);
    if (have_mm)
        PyBuffer_Release(&mm);
    Py_DECREF(queues);
    return result;
}

static PyObject *tail_read_core(ReadState *st, PyObject *tail, int64_t dispatched, int64_t stored, PyObject *mm_obj,
                                int64_t file_from, int64_t file_bytes, int64_t committed, PyObject *topic,
                                PyObject *qid_obj, int64_t qid, int64_t cq_max, int64_t pos, int64_t max_count,
                                int64_t cl_min, PyObject *topic_b, int64_t max_bytes, PyObject *broker, PyObject *msgs,
                                PyObject *skip_topic, int64_t max_topic, int64_t max_records)
{
    TailOut o;
    int rc = tail_read_c(st, tail, dispatched, stored, mm_obj, file_from, file_bytes, committed, topic, qid_obj, qid,
                         cq_max, pos, max_count, cl_min, topic_b, max_bytes, broker, msgs, skip_topic, max_topic,
                         max_records, &o);
    if (rc <= 0)
        return rc < 0 ? NULL : Py_NewRef(Py_None);
    return Py_BuildValue("(LLiL)", (long long)o.hi, (long long)o.next, o.reason, (long long)o.removed);
}

static PyObject *tail_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ReadState *st = state_of(module);
    if (nargs != 20) {
        PyErr_SetString(PyExc_TypeError, "tail_read() takes 20 arguments");
        return NULL;
    }
    if (need_bound(st) < 0)
        return NULL;
    int64_t dispatched, stored, file_from, file_bytes, committed, qid, cq_max, pos, max_count, cl_min, max_bytes,
        max_topic, max_records;
    if (get_i64(args[1], &dispatched) < 0 || get_i64(args[2], &stored) < 0 || get_i64(args[4], &file_from) < 0 ||
        get_i64(args[5], &file_bytes) < 0 || get_i64(args[6], &committed) < 0 || get_i64(args[8], &qid) < 0 ||
        get_i64(args[9], &cq_max) < 0 || get_i64(args[10], &pos) < 0 || get_i64(args[11], &max_count) < 0 ||
        get_i64(args[12], &cl_min) < 0 || get_i64(args[14], &max_bytes) < 0 || get_i64(args[18], &max_topic) < 0 ||
        get_i64(args[19], &max_records) < 0)
        return NULL;
    if (!PyUnicode_Check(args[7]) || !PyBytes_Check(args[13]) || !PyBytes_Check(args[17]) || !PyList_Check(args[16])) {
        PyErr_SetString(PyExc_TypeError, "tail_read(): topic str, topic_b and skip_topic bytes, out a list");
        return NULL;
    }
    return tail_read_core(st, args[0], dispatched, stored, args[3], file_from, file_bytes, committed, args[7], args[8],
                          qid, cq_max, pos, max_count, cl_min, args[13], max_bytes, args[15], args[16], args[17],
                          max_topic, max_records);
}

/* A consumer's round for one queue of a tailing view in one call — pull_consumer.tail_round, its spec:
 * tail_poll(ctx, view, seen, pos, max_count, stored, readable, word, topic, queue_id, out). ctx:
 * (reader, its tail, broker, max_transfer_bytes, skip_topic, max_topic_chars, scan_records), a
 * StoreReader's (StoreReader.poll_context); seen: the consumer's entry for the queue (None, or (view,
 * readable mark or None, max offset, (word, readable) or None)). Returns what tail_round returns —
 *   False                      nothing at ``pos`` (seen unchanged);
 *   (seen, max offset, None)   the tail read, no result where it stopped (the caller's ``get``);
 *   (seen, max offset, next)   the messages from ``pos`` appended to ``out`` (maybe none: removed);
 * or None: not this call's case, the caller runs tail_round (nothing was applied but the consume
 * queue's refresh, which it repeats). The spec's steps: the skip, StoreReader._refresh_cq (its
 * cache; the method itself on a miss), read_tail (tail_read_core), _show, CommitlogTail.caught_up
 * and the new seen entry. */
static int attr_is_none(ReadState *st, PyObject *o, int name, int *is_none)
{
    PyObject *x = PyObject_GetAttr(o, st->names[name]);
    if (x == NULL)
        return -1;
    *is_none = x == Py_None;
    Py_DECREF(x);
    return 0;
}

/* tail_poll's work; args: its 11 arguments (woken_poll builds them) */
static PyObject *tail_poll_core(ReadState *st, PyObject *const *args)
{
    PyObject *ctx = args[0], *view = args[1], *seen = args[2], *word = args[7], *topic = args[8], *qid_obj = args[9],
             *msgs = args[10];
    if (!PyTuple_Check(ctx) || PyTuple_GET_SIZE(ctx) != 7 || !PyUnicode_Check(topic) || !PyList_Check(msgs) ||
        !PyBytes_Check(PyTuple_GET_ITEM(ctx, 4)) || (seen != Py_None && (!PyTuple_Check(seen) ||
                                                                          PyTuple_GET_SIZE(seen) != 4))) {
        PyErr_SetString(PyExc_TypeError, "tail_poll(): a context tuple of 7, a seen tuple of 4, topic str, out a list");
        return NULL;
    }
    PyObject *reader = PyTuple_GET_ITEM(ctx, 0), *tail = PyTuple_GET_ITEM(ctx, 1), *broker = PyTuple_GET_ITEM(ctx, 2),
             *skip_topic = PyTuple_GET_ITEM(ctx, 4);
    int64_t pos, max_count, mark, readable, qid, max_bytes, max_topic, max_records, w = 0;
    if (get_i64(args[3], &pos) < 0 || get_i64(args[4], &max_count) < 0 || get_i64(args[5], &mark) < 0 ||
        get_i64(args[6], &readable) < 0 || get_i64(qid_obj, &qid) < 0 ||
        get_i64(PyTuple_GET_ITEM(ctx, 3), &max_bytes) < 0 || get_i64(PyTuple_GET_ITEM(ctx, 5), &max_topic) < 0 ||
        get_i64(PyTuple_GET_ITEM(ctx, 6), &max_records) < 0 || (word != Py_None && get_i64(word, &w) < 0))
        return NULL;
    /* 1. the skip: the readable mark unchanged since we read the queue to its end, or its word and the
     * readable position unchanged (PullConsumer._read_news) */
    if (seen != Py_None && PyTuple_GET_ITEM(seen, 0) == view) {
        int64_t seen_m, v;
        if (get_i64(PyTuple_GET_ITEM(seen, 2), &seen_m) < 0)
            return NULL;
        if (pos >= seen_m) {
            PyObject *s_mark = PyTuple_GET_ITEM(seen, 1), *s_quiet = PyTuple_GET_ITEM(seen, 3);
            if (s_mark != Py_None) {
                if (get_i64(s_mark, &v) < 0)
                    return NULL;
                if (v == mark)
                    Py_RETURN_FALSE;
            }
            if (word != Py_None && s_quiet != Py_None) {
                int64_t qw, qr;
                if (!PyTuple_Check(s_quiet) || PyTuple_GET_SIZE(s_quiet) != 2) {
                    PyErr_SetString(PyExc_TypeError, "tail_poll(): a seen quiet key (word, readable) expected");
                    return NULL;
                }
                if (get_i64(PyTuple_GET_ITEM(s_quiet, 0), &qw) < 0 || get_i64(PyTuple_GET_ITEM(s_quiet, 1), &qr) < 0)
                    return NULL;
                if (qw == w && qr == readable)
                    Py_RETURN_FALSE;
            }
        }
    }
    PyObject *result = NULL, *key = NULL, *refreshed = NULL, *queues = NULL, *cl = NULL, *mfq = NULL, *files = NULL,
             *mm = NULL, *topic_b = NULL, *shown = NULL;
    /* 2. StoreReader._refresh_cq(topic, queue_id, readable): its cache, else the method */
    int64_t m = 0;
    if (PyObject_SetAttr(reader, st->names[N_READABLE_END], args[6]) < 0 ||
        (key = PyTuple_Pack(2, topic, qid_obj)) == NULL ||
        (refreshed = PyObject_GetAttr(reader, st->names[N_CQ_REFRESHED])) == NULL ||
        (queues = PyObject_GetAttr(reader, st->names[N_QUEUES])) == NULL)
        goto done;
    if (!PyDict_Check(refreshed) || !PyDict_Check(queues)) {
        PyErr_SetString(PyExc_TypeError, "tail_poll(): the reader's _cq_refreshed and queues must be dicts");
        goto done;
    }
    PyObject *c = PyDict_GetItemWithError(refreshed, key);          /* borrowed */
    int hit = 0;
    if (c == NULL && PyErr_Occurred())
        goto done;
    if (c != NULL && PyTuple_Check(c) && PyTuple_GET_SIZE(c) == 2) {
        int64_t at;
        if (get_i64(PyTuple_GET_ITEM(c, 0), &at) < 0 || get_i64(PyTuple_GET_ITEM(c, 1), &m) < 0)
            goto done;
        if (at == readable) {
            int known = PyDict_Contains(queues, key);
            if (known < 0)
                goto done;
            hit = known || m == 0;
        }
    }
    if (!hit) {
        PyObject *x = PyObject_CallMethodObjArgs(reader, st->names[N_REFRESH_CQ], topic, qid_obj, args[6], NULL);
        if (x == NULL)
            goto done;
        int rc = get_i64(x, &m);
        Py_DECREF(x);
        if (rc < 0)
            goto done;
    }
    /* 3. read_tail's native part over the commitlog's newest file */
    if ((cl = PyObject_GetAttr(reader, st->names[N_COMMITLOG])) == NULL ||
        (mfq = PyObject_GetAttr(cl, st->names[N_MFQ])) == NULL ||
        (files = PyObject_GetAttr(mfq, st->names[N_FILES])) == NULL)
        goto done;
    if (!PyList_Check(files) || PyList_GET_SIZE(files) == 0) {
        result = Py_NewRef(Py_None);                    /* no file: the spec */
        goto done;
    }
    PyObject *mf = PyList_GET_ITEM(files, PyList_GET_SIZE(files) - 1);
    int64_t file_from, file_bytes, committed, cl_min;
    if (get_attr_i64(st, mf, N_FILE_FROM_OFFSET, &file_from) < 0 ||
        get_attr_i64(st, mf, N_FILE_BYTES, &file_bytes) < 0 ||
        get_attr_i64(st, mf, N_COMMITTED_POS, &committed) < 0 ||
        get_attr_i64(st, PyList_GET_ITEM(files, 0), N_FILE_FROM_OFFSET, &cl_min) < 0 ||
        (mm = PyObject_GetAttr(mf, st->names[N_MM])) == NULL || (topic_b = PyUnicode_AsUTF8String(topic)) == NULL)
        goto done;
    TailOut o;
    int rc = tail_read_c(st, tail, readable, mark, mm, file_from, file_bytes, committed, topic, qid_obj, qid, m, pos,
                         max_count, cl_min, topic_b, max_bytes, broker, msgs, skip_topic, max_topic, max_records, &o);
    if (rc < 0)
        goto done;
    if (rc == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    long long hi = o.hi, took = o.next, removed = o.removed;
    int why = o.reason;
    /* 4. StoreReader._show */
    if ((shown = PyObject_GetAttr(reader, st->names[N_SHOWN])) == NULL)
        goto done;
    if (!PyDict_Check(shown)) {
        PyErr_SetString(PyExc_TypeError, "tail_poll(): the reader's _shown must be a dict");
        goto done;
    }
    PyObject *was = PyDict_GetItemWithError(shown, key);           /* borrowed */
    int64_t before = 0;
    if (was == NULL && PyErr_Occurred())
        goto done;
    if (was != NULL && get_i64(was, &before) < 0)
        goto done;
    if (hi > before) {
        PyObject *h = PyLong_FromLongLong(hi);
        int rc = h == NULL ? -1 : PyDict_SetItem(shown, key, h);
        Py_XDECREF(h);
        if (rc < 0)
            goto done;
    }
    /* 5. CommitlogTail.caught_up(): not capped, not stopped, the cursor at the limit */
    PyObject *capped = PyObject_GetAttr(tail, st->names[N_CAPPED]);
    if (capped == NULL)
        goto done;
    int is_capped = PyObject_IsTrue(capped), not_stopped;
    Py_DECREF(capped);
    int64_t cursor, limit;
    if (is_capped < 0 || attr_is_none(st, tail, N_STOPPED_AT, &not_stopped) < 0 ||
        get_attr_i64(st, tail, N_CURSOR, &cursor) < 0 ||
        get_attr_i64(st, tail, N_LIMIT, &limit) < 0)
        goto done;
    int caught_up = !is_capped && not_stopped && cursor >= limit;
    /* 6. the queue's new seen entry, and the answer */
    PyObject *quiet = caught_up && word != Py_None ? PyTuple_Pack(2, word, args[6]) : Py_NewRef(Py_None);
    if (quiet == NULL)
        goto done;
    PyObject *new_seen = Py_BuildValue("(OOLN)", view, caught_up ? args[5] : Py_None, hi, quiet);
    if (new_seen == NULL)
        goto done;
    (void)removed;              /* the status (FOUND, MESSAGE_WAS_REMOVING, ...) moves a position alike */
    if (why != TAKE_DONE && why != TAKE_FULL)
        result = Py_BuildValue("(NLO)", new_seen, hi, Py_None);
    else
        result = Py_BuildValue("(NLL)", new_seen, hi, (long long)(pos + took));
done:
    Py_XDECREF(key);
    Py_XDECREF(refreshed);
    Py_XDECREF(queues);
    Py_XDECREF(cl);
    Py_XDECREF(mfq);
    Py_XDECREF(files);
    Py_XDECREF(mm);
    Py_XDECREF(topic_b);
    Py_XDECREF(shown);
    return result;
}

static PyObject *tail_poll(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ReadState *st = state_of(module);
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "tail_poll() takes 11 arguments");
        return NULL;
    }
    if (need_bound(st) < 0)
        return NULL;
    return tail_poll_core(st, args);
}

/* A consumer's round for one queue as it wakes — its wake word, BrokerState.consumer_ends and tail_poll
 * in one call: woken_poll(f, pos, seen, max_count, out). f: (view, ctx, state, words, topic, queue_id,
 * i_write, i_committed, i_confirmed, i_dispatched, wake, i_wake, armed), PullConsumer._woken_round's:
 * the view and the reader's poll context, the view's BrokerState, its words (a buffer of int64) and
 * the indexes of write_pos, committed_pos, confirmed_pos and dispatched_pos in them; ``wake``: None
 * (a consumer of one queue: no wake word, as _read_news passes none), or the queue wake words (a
 * buffer of int64), the queue's word's index and the value it had when the consumer went to sleep.
 * First the queue's word (BrokerView.quiet_words, read before the ends): unchanged since the sleep,
 * no news of this queue — False, nothing read or applied. Then consumer_ends's common case written
 * out — the same words in the same order: the stored end (the lower of write_pos and committed_pos),
 * the readable end (dispatched_pos), the state's ``_shown_end`` raised to them — then tail_poll with
 * the word. Returns tail_poll's answers, or None where a replication process bounds what consumers
 * read (confirmed_pos >= 0): the caller's general round, nothing applied. The caller holds no
 * SYNC_FLUSH state here (consumer_ends reads flushed_pos then). */
static inline int64_t load_word(const int64_t *w, int64_t i) { return __atomic_load_n(w + i, __ATOMIC_ACQUIRE); }

/* ``o``'s buffer of int64 words into ``b``, every index of ``idx`` inside it (aligned): 0, or -1 with
 * an error set and nothing held. */
static int get_words(PyObject *o, Py_buffer *b, const int64_t *idx, int n, const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "woken_poll(): %s must be a contiguous buffer", what);
        return -1;
    }
    int ok = !((uintptr_t)b->buf & 7);
    for (int k = 0; ok && k < n; k++)
        ok = idx[k] >= 0 && idx[k] < (int64_t)(b->len / 8);
    if (!ok) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_ValueError, "woken_poll(): a word index outside %s", what);
        return -1;
    }
    return 0;
}

static PyObject *woken_poll(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ReadState *st = state_of(module);
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "woken_poll() takes 5 arguments");
        return NULL;
    }
    if (need_bound(st) < 0)
        return NULL;
    PyObject *f = args[0];
    if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 13) {
        PyErr_SetString(PyExc_TypeError, "woken_poll(): a round tuple of 13 expected");
        return NULL;
    }
    int64_t idx[4];
    for (int k = 0; k < 4; k++)
        if (get_i64(PyTuple_GET_ITEM(f, 6 + k), &idx[k]) < 0)
            return NULL;
    PyObject *word = NULL;                          /* (new) the queue's wake word, or None */
    if (PyTuple_GET_ITEM(f, 10) == Py_None)
        word = Py_NewRef(Py_None);
    else {
        int64_t wi, armed;
        Py_buffer wb;
        if (get_i64(PyTuple_GET_ITEM(f, 11), &wi) < 0 || get_i64(PyTuple_GET_ITEM(f, 12), &armed) < 0 ||
            get_words(PyTuple_GET_ITEM(f, 10), &wb, &wi, 1, "the queue wake words") < 0)
            return NULL;
        int64_t v = load_word((const int64_t *)wb.buf, wi);
        PyBuffer_Release(&wb);
        if (v == armed)
            Py_RETURN_FALSE;                        /* its word has not moved: no news of this queue */
        if ((word = PyLong_FromLongLong(v)) == NULL)
            return NULL;
    }
    Py_buffer b;
    if (get_words(PyTuple_GET_ITEM(f, 3), &b, idx, 4, "the state's words") < 0) {
        Py_DECREF(word);
        return NULL;
    }
    const int64_t *w = (const int64_t *)b.buf;
    int64_t stored = load_word(w, idx[0]), committed = load_word(w, idx[1]), readable = 0;
    if (committed < stored)
        stored = committed;
    int bounded = load_word(w, idx[2]) >= 0;
    if (!bounded) {
        readable = load_word(w, idx[3]);
        bounded = load_word(w, idx[2]) >= 0;
    }
    PyBuffer_Release(&b);
    if (bounded) {
        Py_DECREF(word);
        Py_RETURN_NONE;
    }
    PyObject *state = PyTuple_GET_ITEM(f, 2), *result = NULL, *mark = NULL, *ready = NULL;
    int64_t shown, top = stored > readable ? stored : readable;
    if (get_attr_i64(st, state, N_SHOWN_END, &shown) < 0 ||
        (top > shown && set_attr_i64(st, state, N_SHOWN_END, top) < 0)) {
        Py_DECREF(word);
        return NULL;
    }
    if ((mark = PyLong_FromLongLong(stored)) != NULL && (ready = PyLong_FromLongLong(readable)) != NULL) {
        PyObject *targs[11] = {PyTuple_GET_ITEM(f, 1), PyTuple_GET_ITEM(f, 0), args[2], args[1], args[3], mark,
                               ready, word, PyTuple_GET_ITEM(f, 4), PyTuple_GET_ITEM(f, 5), args[4]};
        result = tail_poll_core(st, targs);
    }
    Py_XDECREF(mark);
    Py_XDECREF(ready);
    Py_DECREF(word);
    return result;
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
    {"cq_readable", (PyCFunction)(void (*)(void))cq_readable, METH_FASTCALL,
     "readonly.readable_entries: the boundary after a consume-queue file's readable new entries."},
    {"tail_read", (PyCFunction)(void (*)(void))tail_read, METH_FASTCALL,
     "CommitlogTail.advance, count_after and take in one call, its common case (or None)."},
    {"tail_scan", (PyCFunction)(void (*)(void))tail_scan, METH_FASTCALL, "store/tail.py's scan, its common case."},
    {"tail_poll", (PyCFunction)(void (*)(void))tail_poll, METH_FASTCALL,
     "PullConsumer._read_news's tailing part for one queue: skip, or refresh, read and seen entry (or None)."},
    {"woken_poll", (PyCFunction)(void (*)(void))woken_poll, METH_FASTCALL,
     "A queue's wake word, BrokerState.consumer_ends and tail_poll in one call: a woken consumer's round (or None)."},
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
    for (int k = 0; k < N_COUNT; k++)
        if ((st->names[k] = PyUnicode_InternFromString(NAME_TEXT[k])) == NULL)
            return -1;
    st->tq_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &tq_spec, NULL);
    if (st->tq_type == NULL || PyModule_AddType(m, st->tq_type) < 0)
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
    Py_VISIT(st->tq_type);
    return 0;
}

static int read_clear(PyObject *m)
{
    ReadState *st = state_of(m);
    Py_CLEAR(st->msg_cls);
    Py_CLEAR(st->cq_dtype);
    Py_CLEAR(st->tq_type);
    for (int k = 0; k < N_COUNT; k++)
        Py_CLEAR(st->names[k]);
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
