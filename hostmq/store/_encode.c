/* hostmq.store._encode: a producer's messages as the records of one frame, in one call.
 *
 * The spec is ``py_encode_messages`` in hostmq/store/encode.py: each message checked as
 * ``Producer.prepare`` checks it (``check_body``, the 32-bit flag, ``properties_bytes`` with a fresh
 * unique id), then ``encode_records``; and ``py_batch_msg_ids`` there (a batch's message ids).
 * tests/store/test_encode_native.py compares them byte for byte with hypothesis, hostile messages
 * included.
 *
 * ``encode_messages()`` decides only the common case, the one a producer sends thousands of a second:
 * a ``Message`` of exactly that class, of the batch's topic, a ``bytes`` body within the limit, an
 * ``int`` flag of 32 bits, no delay, no user properties, no keys, and tags that are None or a str
 * without the property separators. For anything else — and before any unique id is drawn, so nothing
 * is used up — it returns None and the caller hands the whole batch to the spec, which then gives its
 * own result or error. The first pass reads and checks every message (holding a reference to what it
 * will copy); the second draws the ids (the producer's ``records.unique_id_source()``) and writes the
 * records into one ``bytes`` object.
 *
 * Slots are read at the offsets ``_bind`` takes from ``Message``'s member descriptors, only for objects
 * whose type is exactly ``Message`` (a subclass may add or change attributes: the spec takes it). The
 * layout is records.py's, from the generated include/record_layout.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "../include/record_layout.h"
#include "../include/record_check.h"
#include "../include/crc32_fast.h"

#define LAYOUT_HOLDS(cond) _Static_assert(cond, "hostmq/include/record_layout.h: " #cond)
LAYOUT_HOLDS(OFF_TOTAL_SIZE == 0 && W_TOTAL_SIZE == 4 && W_MAGIC == 4 && W_BODY_CRC == 4);
LAYOUT_HOLDS(W_QUEUE_ID == 4 && W_FLAG == 4 && W_BORN_TS_MS == 8 && W_BODY_LENGTH == 4);
LAYOUT_HOLDS((int)W_BORN_HOST == (int)HOST_BYTES && (int)W_STORE_HOST == (int)HOST_BYTES);
LAYOUT_HOLDS(HDR_BYTES == OFF_BODY_LENGTH + W_BODY_LENGTH);
LAYOUT_HOLDS(TOPIC_LEN_BYTES == 1 && PROPS_LEN_BYTES == 2);

#define UID_HEX 16                      /* f"{prefix}{counter:016X}": a 64-bit counter */
#define MAX_PREFIX 64
#define CRC_WITHOUT_GIL_BYTES (5 * 1024)

/* Message's slots, in the order _bind takes them. */
enum { S_TOPIC, S_BODY, S_TAGS, S_KEYS, S_PROPERTIES, S_DELAY, S_FLAG, S_COUNT };
static const char *const slot_names[S_COUNT] = {"topic", "body", "tags", "keys", "properties", "delay_level",
                                                "flag"};

typedef struct {
    PyTypeObject *message_type;         /* NULL until _bind */
    Py_ssize_t offset[S_COUNT];
    PyTypeObject *result_type;          /* the last result type send_result(s) checked (NULL: none yet) */
    Py_ssize_t result_off[4];           /* its slots' offsets */
} EncodeState;

static inline EncodeState *state_of(PyObject *module) { return (EncodeState *)PyModule_GetState(module); }

static inline PyObject *slot(PyObject *o, Py_ssize_t offset) { return *(PyObject **)((char *)o + offset); }

/* One message of the common case, as pass 1 found it (references held until the end of the call). */
typedef struct {
    PyObject *body, *tags;              /* owned */
    const char *tags_utf8;              /* NULL: no tags */
    Py_ssize_t tags_len, body_len;
    int32_t flag;
    uint32_t size;                      /* the whole record */
} Item;

static void release_one(Item *it)
{
    Py_XDECREF(it->body);
    Py_XDECREF(it->tags);
}

static void release(Item *items, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(items[i].body);
        Py_XDECREF(items[i].tags);
    }
    PyMem_Free(items);
}

static int as_int(PyObject *o, long long lo, long long hi, long long *out)
{
    if (!PyLong_CheckExact(o))
        return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    if (v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* A falsy container left at Message's defaults: None, an empty dict, an empty tuple. */
static int empty(PyObject *o)
{
    return o == Py_None || (PyDict_CheckExact(o) && PyDict_GET_SIZE(o) == 0) ||
           (PyTuple_CheckExact(o) && PyTuple_GET_SIZE(o) == 0);
}

static void put_hex16(unsigned char *o, uint64_t v)
{
    static const char digits[] = "0123456789ABCDEF";
    for (int i = UID_HEX - 1; i >= 0; i--, v >>= 4)
        o[i] = (unsigned char)digits[v & 0xF];
}

/* One message of the common case (see the top of this file) into ``it``, its references held: 0; or
 * -1 where the spec must take it (nothing held then, no error set). ``tags_part``: the TAGS name and its
 * separator; ``uniq_part``: the UNIQ_KEY property's bytes. */
static int check_item(const EncodeState *st, PyObject *m, PyObject *topic, Py_ssize_t tlen, long long max_body,
                      long long max_props, Py_ssize_t tags_part, Py_ssize_t uniq_part, Item *it)
{
    if (!Py_IS_TYPE(m, st->message_type))
        return -1;
    PyObject *v[S_COUNT];
    for (int s = 0; s < S_COUNT; s++)
        if ((v[s] = slot(m, st->offset[s])) == NULL)          /* a deleted attribute */
            return -1;
    if (v[S_TOPIC] != topic) {
        if (!PyUnicode_CheckExact(v[S_TOPIC]))
            return -1;
        int c = PyUnicode_Compare(v[S_TOPIC], topic);
        if (c != 0) {
            PyErr_Clear();
            return -1;
        }
    }
    long long flag, delay;
    if (!PyBytes_CheckExact(v[S_BODY]) || as_int(v[S_FLAG], INT32_MIN, INT32_MAX, &flag) < 0 ||
        as_int(v[S_DELAY], 0, 0, &delay) < 0 || !empty(v[S_KEYS]) || !empty(v[S_PROPERTIES]))
        return -1;
    it->body_len = PyBytes_GET_SIZE(v[S_BODY]);
    if (it->body_len < 1 || it->body_len > max_body)
        return -1;
    it->flag = (int32_t)flag;
    it->tags_utf8 = NULL;
    it->tags_len = 0;
    Py_ssize_t plen = uniq_part;
    if (v[S_TAGS] != Py_None) {
        if (!PyUnicode_CheckExact(v[S_TAGS]))
            return -1;
        it->tags_utf8 = PyUnicode_AsUTF8AndSize(v[S_TAGS], &it->tags_len);
        if (it->tags_utf8 == NULL) {               /* a lone surrogate: the spec's encode raises */
            PyErr_Clear();
            return -1;
        }
        if (memchr(it->tags_utf8, '\x01', (size_t)it->tags_len) || memchr(it->tags_utf8, '\x02', (size_t)it->tags_len))
            return -1;
        plen += tags_part + it->tags_len + 1;
    }
    if (plen > max_props)
        return -1;
    long long size = (long long)HDR_BYTES + it->body_len + TOPIC_LEN_BYTES + tlen + PROPS_LEN_BYTES + plen;
    if (size > INT32_MAX)
        return -1;
    it->size = (uint32_t)size;
    it->body = Py_NewRef(v[S_BODY]);
    it->tags = it->tags_utf8 != NULL ? Py_NewRef(v[S_TAGS]) : NULL;
    return 0;
}

/* The record of ``it`` at ``o`` (its ``size`` bytes); where the next one goes. */
static unsigned char *write_record(unsigned char *o, const Item *it, uint32_t queue_id, long long born_ts,
                                   const unsigned char *bh, Py_ssize_t bhn, const unsigned char *sh, Py_ssize_t shn,
                                   const char *tb, Py_ssize_t tlen, const char *tname, Py_ssize_t tn,
                                   const char *uname, Py_ssize_t un, const char *prefix, Py_ssize_t prefix_len,
                                   uint64_t uid)
{
    const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(it->body);
    memset(o, 0, HDR_BYTES);
    put32(o + OFF_TOTAL_SIZE, it->size);
    put32(o + OFF_MAGIC, MAGIC_CODE);
    put32(o + OFF_BODY_CRC, hm_body_crc(body, (size_t)it->body_len));
    put32(o + OFF_QUEUE_ID, queue_id);
    put32(o + OFF_FLAG, (uint32_t)it->flag);
    put64(o + OFF_BORN_TS_MS, (uint64_t)born_ts);
    memcpy(o + OFF_BORN_HOST, bh, (size_t)bhn);
    memcpy(o + OFF_STORE_HOST, sh, (size_t)shn);
    put32(o + OFF_BODY_LENGTH, (uint32_t)it->body_len);
    unsigned char *p = o + HDR_BYTES;
    memcpy(p, body, (size_t)it->body_len);
    p += it->body_len;
    *p++ = (unsigned char)tlen;
    memcpy(p, tb, (size_t)tlen);
    p += tlen;
    unsigned char *plen_at = p;
    p += PROPS_LEN_BYTES;
    unsigned char *props = p;
    if (it->tags_utf8 != NULL) {
        memcpy(p, tname, (size_t)tn);
        p += tn;
        *p++ = (unsigned char)NAME_VALUE_SEP;
        memcpy(p, it->tags_utf8, (size_t)it->tags_len);
        p += it->tags_len;
        *p++ = (unsigned char)PROPERTY_END;
    }
    memcpy(p, uname, (size_t)un);
    p += un;
    *p++ = (unsigned char)NAME_VALUE_SEP;
    memcpy(p, prefix, (size_t)prefix_len);
    p += prefix_len;
    put_hex16(p, uid);
    p += UID_HEX;
    *p++ = (unsigned char)PROPERTY_END;
    put16(plen_at, (uint16_t)(p - props));
    return p;
}

/* The next unique id from the producer's counter (``records.unique_id_source()``): 0, or -1 with an
 * error set (the counter raised, or gave no 64-bit unsigned int). */
static int draw_uid(PyObject *uid_next, uint64_t *out)
{
    PyObject *c = PyObject_CallNoArgs(uid_next);
    if (c == NULL)
        return -1;
    unsigned long long u = PyLong_Check(c) ? PyLong_AsUnsignedLongLong(c) : (unsigned long long)-1;
    int bad = PyErr_Occurred() != NULL || !PyLong_Check(c);
    Py_DECREF(c);
    if (bad) {
        PyErr_Clear();
        PyErr_SetString(PyExc_OverflowError, "the unique id counter is not a 64-bit unsigned int");
        return -1;
    }
    *out = (uint64_t)u;
    return 0;
}

/* encode_messages(msgs, topic, topic_b, queue_id, born_ts_ms, born_host, store_host, max_body_bytes,
 *                 max_props_bytes, tags_name, uniq_name, uid_prefix, uid_next)
 * -> (payload bytes, [record sizes]) or None (not the common case: ask the spec). */
static PyObject *encode_messages(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    EncodeState *st = state_of(self);
    if (nargs != 13) {
        PyErr_Format(PyExc_TypeError, "encode_messages takes 13 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *msgs = args[0], *topic = args[1], *topic_b = args[2], *born_host = args[5], *store_host = args[6],
             *tags_name = args[9], *uniq_name = args[10], *uid_prefix = args[11], *uid_next = args[12];
    long long queue_id, born_ts, max_body, max_props;
    if (st->message_type == NULL || !PyList_CheckExact(msgs) || !PyUnicode_CheckExact(topic) ||
        !PyBytes_CheckExact(topic_b) || !PyBytes_CheckExact(born_host) || !PyBytes_CheckExact(store_host) ||
        !PyBytes_CheckExact(tags_name) || !PyBytes_CheckExact(uniq_name) || !PyUnicode_CheckExact(uid_prefix) ||
        as_int(args[3], INT32_MIN, INT32_MAX, &queue_id) < 0 || as_int(args[4], LLONG_MIN, LLONG_MAX, &born_ts) < 0 ||
        as_int(args[7], 0, INT32_MAX, &max_body) < 0 || as_int(args[8], 0, 0xFFFF, &max_props) < 0)
        Py_RETURN_NONE;
    Py_ssize_t prefix_len;
    const char *prefix = PyUnicode_AsUTF8AndSize(uid_prefix, &prefix_len);
    if (prefix == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyList_GET_SIZE(msgs), tlen = PyBytes_GET_SIZE(topic_b);
    Py_ssize_t tn = PyBytes_GET_SIZE(tags_name), un = PyBytes_GET_SIZE(uniq_name);
    if (n == 0 || tlen > 0xFF || prefix_len > MAX_PREFIX || !PyUnicode_IS_ASCII(uid_prefix))
        Py_RETURN_NONE;
    /* PROPERTIES without tags: UNIQ\x01<id>\x02; with: TAGS\x01<tags>\x02 first. */
    Py_ssize_t uniq_part = un + 1 + prefix_len + UID_HEX + 1;
    Item *items = PyMem_Calloc((size_t)n, sizeof(Item));
    if (items == NULL)
        return PyErr_NoMemory();
    long long total = 0;
    Py_ssize_t got = 0;
    /* pass 1: every message is the common case, or the spec takes the batch */
    for (; got < n; got++) {
        if (check_item(st, PyList_GET_ITEM(msgs, got), topic, tlen, max_body, max_props, tn + 1, uniq_part,
                       &items[got]) < 0)
            goto ask_spec;
        total += items[got].size;
        if (total > PY_SSIZE_T_MAX / 2)
            goto ask_spec;
    }
    /* pass 2: the ids, then the records */
    PyObject *payload = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    PyObject *sizes = PyList_New(n);
    uint64_t *uids = PyMem_Malloc((size_t)n * sizeof(uint64_t));
    if (payload == NULL || sizes == NULL || uids == NULL)
        goto failed;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (draw_uid(uid_next, &uids[i]) < 0)
            goto failed;
        PyObject *sz = PyLong_FromUnsignedLong(items[i].size);
        if (sz == NULL)
            goto failed;
        PyList_SET_ITEM(sizes, i, sz);
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(payload);
    const unsigned char *bh = (const unsigned char *)PyBytes_AS_STRING(born_host);
    const unsigned char *sh = (const unsigned char *)PyBytes_AS_STRING(store_host);
    Py_ssize_t bhn = PyBytes_GET_SIZE(born_host) < HOST_BYTES ? PyBytes_GET_SIZE(born_host) : HOST_BYTES;
    Py_ssize_t shn = PyBytes_GET_SIZE(store_host) < HOST_BYTES ? PyBytes_GET_SIZE(store_host) : HOST_BYTES;
    const char *tb = PyBytes_AS_STRING(topic_b), *tname = PyBytes_AS_STRING(tags_name),
               *uname = PyBytes_AS_STRING(uniq_name);
    int free_gil = total > CRC_WITHOUT_GIL_BYTES;      /* every object read below is held and immutable */
    PyThreadState *ts = free_gil ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        o = write_record(o, &items[i], (uint32_t)queue_id, born_ts, bh, bhn, sh, shn, tb, tlen, tname, tn, uname, un,
                         prefix, prefix_len, uids[i]);
    if (free_gil)
        PyEval_RestoreThread(ts);
    PyMem_Free(uids);
    release(items, n);
    PyObject *out = PyTuple_Pack(2, payload, sizes);
    Py_DECREF(payload);
    Py_DECREF(sizes);
    return out;

failed:
    PyMem_Free(uids);
    Py_XDECREF(payload);
    Py_XDECREF(sizes);
    release(items, n);
    return NULL;
ask_spec:
    release(items, n);
    Py_RETURN_NONE;
}

/* batch_msg_ids(host_hex, phys, sizes) -> "<host_hex><phys:016X>,..." for records back to back from
 * phys (py_batch_msg_ids); None where an argument is not the common case. */
static PyObject *batch_msg_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "batch_msg_ids takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *host = args[0], *sizes = args[2];
    long long phys;
    if (!PyUnicode_CheckExact(host) || !PyUnicode_IS_ASCII(host) || !PyList_CheckExact(sizes) ||
        as_int(args[1], 0, LLONG_MAX, &phys) < 0)
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(sizes), hn = PyUnicode_GET_LENGTH(host);
    if (n == 0 || hn > MAX_PREFIX)
        Py_RETURN_NONE;
    long long at = phys;
    for (Py_ssize_t i = 0; i < n; i++) {        /* every start fits 16 hex digits */
        long long s;
        if (as_int(PyList_GET_ITEM(sizes, i), 0, INT32_MAX, &s) < 0 || at > LLONG_MAX - s)
            Py_RETURN_NONE;
        at += s;
    }
    PyObject *out = PyUnicode_New(n * (hn + UID_HEX) + (n - 1), 127);
    if (out == NULL)
        return NULL;
    unsigned char *o = PyUnicode_1BYTE_DATA(out);
    const unsigned char *h = PyUnicode_1BYTE_DATA(host);
    at = phys;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i)
            *o++ = ',';
        memcpy(o, h, (size_t)hn);
        o += hn;
        put_hex16(o, (uint64_t)at);
        o += UID_HEX;
        at += PyLong_AsLongLong(PyList_GET_ITEM(sizes, i));
    }
    return out;
}

/* restamp(payload, sizes, queue_id, store_host) -> a copy of records back to back (sizes) with QUEUEID
 * and STOREHOST set (py_restamp: a batch encoded before its queue was chosen); None where an argument
 * is not the common case. */
static PyObject *restamp(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "restamp takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *payload = args[0], *sizes = args[1], *host = args[3];
    long long queue_id;
    if (!PyBytes_CheckExact(payload) || !PyList_CheckExact(sizes) || !PyBytes_CheckExact(host) ||
        as_int(args[2], INT32_MIN, INT32_MAX, &queue_id) < 0)
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(sizes), len = PyBytes_GET_SIZE(payload), at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long s;
        if (as_int(PyList_GET_ITEM(sizes, i), HDR_BYTES, INT32_MAX, &s) < 0 || s > len - at)
            Py_RETURN_NONE;
        at += (Py_ssize_t)s;
    }
    if (at != len)
        Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(PyBytes_AS_STRING(payload), len);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t hn = PyBytes_GET_SIZE(host) < HOST_BYTES ? PyBytes_GET_SIZE(host) : HOST_BYTES;
    at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        put32(o + at + OFF_QUEUE_ID, (uint32_t)queue_id);
        memset(o + at + OFF_STORE_HOST, 0, HOST_BYTES);
        memcpy(o + at + OFF_STORE_HOST, PyBytes_AS_STRING(host), (size_t)hn);
        at += (Py_ssize_t)PyLong_AsLongLong(PyList_GET_ITEM(sizes, i));
    }
    return out;
}

/* ---- open frames of records (a producer's send_async); the spec is hostmq/store/gather.py PyGather ---
 *
 * Gather(frame_type, view_type, uid_source, host, max_messages, max_bytes, compress_over, max_body,
 *        max_props) keeps a producer's open async frames: ``open`` (topic -> AsyncFrame) and
 * ``topics`` (topic -> its bytes, the topics the producer validated), both dicts Python fills.
 * ``add(msg)`` encodes a message of the common case (as encode_messages takes it, for queue 0 and no
 * broker; its body at most ``compress_over`` bytes) onto the end of its topic's open frame — the
 * frame's ``buf`` (a bytearray) and ``sizes`` (a list) — and returns its view, a ``view_type`` whose
 * ``_frame`` and ``_index`` slots are set; None (nothing changed) for anything else: no open frame
 * yet, a topic not validated yet, any other message. ``due`` is then the frame if it must go out now
 * (full, or no frame in flight), and ``take_due()`` / ``take(topic)`` / ``take_all()`` take open
 * frames for publishing (each counted in ``inflight`` until ``answered()``). Each call runs whole
 * under the GIL (no Python code runs in it: no allocation the cyclic GC tracks once the frame is
 * looked up), so the calls are atomic for the producer's threads. */
enum { G_BUF, G_SIZES, G_VFRAME, G_VINDEX, G_OFFSETS };

typedef struct {
    PyObject_HEAD
    PyObject *open, *topics, *frame_type, *view_type, *uid_source, *host, *tags_name, *uniq_name, *due;
    Py_ssize_t off[G_OFFSETS];
    long long inflight, max_messages, max_bytes, compress_over, max_body, max_props;
} Gather;

static int slot_offset(PyTypeObject *t, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyDict_GetItemString(t->tp_dict, name);      /* borrowed */
    if (d == NULL || !PyObject_TypeCheck(d, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", t->tp_name, name);
        return -1;
    }
    *out = ((PyMemberDescrObject *)d)->d_member->offset;
    return 0;
}

static int gather_init(Gather *g, PyObject *args, PyObject *kwargs)
{
    PyObject *ft, *vt, *uid, *host, *tname, *uname;
    long long mm, mb, co, mx, mp;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Gather takes positional arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!O!O!O!SSLLLLL", &PyType_Type, &ft, &PyType_Type, &vt, &PyList_Type, &uid,
                          &PyList_Type, &host, &tname, &uname, &mm, &mb, &co, &mx, &mp))
        return -1;
    if (mm < 1 || mb < 1 || co < 0 || mx < 0 || mx > INT32_MAX || mp < 0 || mp > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "Gather: limits out of range");
        return -1;
    }
    if (slot_offset((PyTypeObject *)ft, "buf", &g->off[G_BUF]) < 0 ||
        slot_offset((PyTypeObject *)ft, "sizes", &g->off[G_SIZES]) < 0 ||
        slot_offset((PyTypeObject *)vt, "_frame", &g->off[G_VFRAME]) < 0 ||
        slot_offset((PyTypeObject *)vt, "_index", &g->off[G_VINDEX]) < 0)
        return -1;
    PyObject *open = PyDict_New(), *topics = PyDict_New();
    if (open == NULL || topics == NULL) {
        Py_XDECREF(open);
        Py_XDECREF(topics);
        return -1;
    }
    Py_XSETREF(g->open, open);
    Py_XSETREF(g->topics, topics);
    Py_XSETREF(g->frame_type, Py_NewRef(ft));
    Py_XSETREF(g->view_type, Py_NewRef(vt));
    Py_XSETREF(g->uid_source, Py_NewRef(uid));
    Py_XSETREF(g->host, Py_NewRef(host));
    Py_XSETREF(g->tags_name, Py_NewRef(tname));
    Py_XSETREF(g->uniq_name, Py_NewRef(uname));
    Py_CLEAR(g->due);
    g->inflight = 0;
    g->max_messages = mm; g->max_bytes = mb; g->compress_over = co; g->max_body = mx; g->max_props = mp;
    return 0;
}

static inline PyObject **oslot(PyObject *o, Py_ssize_t offset) { return (PyObject **)((char *)o + offset); }

/* The open frame of ``topic`` whose buf and sizes are a bytearray and a list, or NULL. */
static PyObject *open_frame(Gather *g, PyObject *topic)
{
    PyObject *fr = PyDict_GetItemWithError(g->open, topic);     /* borrowed; str keys: no Python code */
    if (fr == NULL || !Py_IS_TYPE(fr, (PyTypeObject *)g->frame_type))
        return NULL;
    PyObject *buf = *oslot(fr, g->off[G_BUF]), *sizes = *oslot(fr, g->off[G_SIZES]);
    if (buf == NULL || sizes == NULL || !PyByteArray_CheckExact(buf) || !PyList_CheckExact(sizes))
        return NULL;
    return fr;
}

/* Mark ``fr`` (holding ``count`` records in ``nbytes``) due if it must go now. */
static void note_due(Gather *g, PyObject *fr, Py_ssize_t count, Py_ssize_t nbytes)
{
    if (count >= g->max_messages || nbytes >= g->max_bytes || g->inflight <= 0)
        Py_XSETREF(g->due, Py_NewRef(fr));
}

/* ``record`` (bytes, or written in place by ``item`` when record is NULL) onto fr; its view, or NULL. */
static PyObject *append(Gather *g, PyObject *fr, PyObject *view, Py_ssize_t size, const void *record)
{
    PyObject *buf = *oslot(fr, g->off[G_BUF]), *sizes = *oslot(fr, g->off[G_SIZES]);
    Py_ssize_t at = PyByteArray_GET_SIZE(buf), index = PyList_GET_SIZE(sizes);
    PyObject *sz = PyLong_FromSsize_t(size), *ix = PyLong_FromSsize_t(index);
    if (sz == NULL || ix == NULL || PyByteArray_Resize(buf, at + size) < 0) {
        Py_XDECREF(sz);
        Py_XDECREF(ix);
        return NULL;
    }
    if (PyList_Append(sizes, sz) < 0) {
        PyByteArray_Resize(buf, at);
        Py_DECREF(sz);
        Py_DECREF(ix);
        return NULL;
    }
    Py_DECREF(sz);
    if (record != NULL)
        memcpy(PyByteArray_AS_STRING(buf) + at, record, (size_t)size);
    Py_XSETREF(*oslot(view, g->off[G_VFRAME]), Py_NewRef(fr));
    Py_XSETREF(*oslot(view, g->off[G_VINDEX]), ix);
    note_due(g, fr, index + 1, at + size);
    return view;
}

/* A view, left out of the cyclic GC's lists: a producer may hold millions of them at once, and a view
 * is in a cycle only while its frame's callbacks name it (cleared once the frame is done), so the
 * collector's passes over them would find nothing but cost the sender its throughput. */
static PyObject *new_view(Gather *g)
{
    PyTypeObject *vt = (PyTypeObject *)g->view_type;
    PyObject *v = vt->tp_alloc(vt, 0);
    if (v != NULL && PyObject_IS_GC(v) && PyObject_GC_IsTracked(v))
        PyObject_GC_UnTrack(v);
    return v;
}

static PyObject *gather_add(Gather *g, PyObject *msg)
{
    EncodeState *st = PyType_GetModuleState(Py_TYPE(g));
    if (st == NULL || st->message_type == NULL || !Py_IS_TYPE(msg, st->message_type))
        Py_RETURN_NONE;
    PyObject *topic = slot(msg, st->offset[S_TOPIC]), *body = slot(msg, st->offset[S_BODY]);
    if (topic == NULL || body == NULL || !PyUnicode_CheckExact(topic) || !PyBytes_CheckExact(body) ||
        PyBytes_GET_SIZE(body) > g->compress_over)
        Py_RETURN_NONE;
    PyObject *topic_b = PyDict_GetItemWithError(g->topics, topic);
    if (topic_b == NULL || !PyBytes_CheckExact(topic_b) || PyBytes_GET_SIZE(topic_b) > 0xFF ||
        open_frame(g, topic) == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (PyList_GET_SIZE(g->uid_source) < 1 || PyList_GET_SIZE(g->host) < 1)
        Py_RETURN_NONE;
    PyObject *src = PyList_GET_ITEM(g->uid_source, 0), *hostb = PyList_GET_ITEM(g->host, 0);
    if (!PyTuple_CheckExact(src) || PyTuple_GET_SIZE(src) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(src, 0)) ||
        !PyBytes_CheckExact(hostb))
        Py_RETURN_NONE;
    PyObject *uid_prefix = PyTuple_GET_ITEM(src, 0), *uid_next = PyTuple_GET_ITEM(src, 1);
    Py_ssize_t prefix_len;
    const char *prefix = PyUnicode_AsUTF8AndSize(uid_prefix, &prefix_len);
    if (prefix == NULL || prefix_len > MAX_PREFIX || !PyUnicode_IS_ASCII(uid_prefix)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t tn = PyBytes_GET_SIZE(g->tags_name), un = PyBytes_GET_SIZE(g->uniq_name);
    Item it = {0};
    if (check_item(st, msg, topic, PyBytes_GET_SIZE(topic_b), g->max_body, g->max_props, tn + 1,
                   un + 1 + prefix_len + UID_HEX + 1, &it) < 0)
        Py_RETURN_NONE;
    /* Held from here: the message's body and tags, the topic's bytes, the id source. Objects the GC
     * tracks are made first (the view), the frame looked up again after them. */
    Py_INCREF(topic_b);
    Py_INCREF(src);
    Py_INCREF(hostb);
    PyObject *out = NULL, *view = new_view(g);
    if (view == NULL)
        goto done;
    uint64_t u;
    if (draw_uid(uid_next, &u) < 0)
        goto done;
    PyObject *fr = open_frame(g, topic);
    if (fr == NULL) {                                   /* taken meanwhile: Python starts the next one */
        if (!PyErr_Occurred())
            out = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *buf = *oslot(fr, g->off[G_BUF]);
    Py_ssize_t at = PyByteArray_GET_SIZE(buf);
    if (append(g, fr, view, (Py_ssize_t)it.size, NULL) == NULL)
        goto done;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    long long born_ts = (long long)now.tv_sec * 1000LL + now.tv_nsec / 1000000;
    Py_ssize_t bhn = PyBytes_GET_SIZE(hostb) < HOST_BYTES ? PyBytes_GET_SIZE(hostb) : HOST_BYTES;
    write_record((unsigned char *)PyByteArray_AS_STRING(buf) + at, &it, 0, born_ts,
                 (const unsigned char *)PyBytes_AS_STRING(hostb), bhn, (const unsigned char *)"", 0,
                 PyBytes_AS_STRING(topic_b), PyBytes_GET_SIZE(topic_b), PyBytes_AS_STRING(g->tags_name), tn,
                 PyBytes_AS_STRING(g->uniq_name), un,
                 prefix, prefix_len, u);
    out = Py_NewRef(view);
done:
    Py_XDECREF(view);
    Py_DECREF(topic_b);
    Py_DECREF(src);
    Py_DECREF(hostb);
    release_one(&it);
    return out;
}

/* put(frame, record): ``record`` (bytes, encoded by Python) onto ``frame`` if it is still its topic's
 * open frame: its view; None otherwise (Python starts another). */
static PyObject *gather_put(Gather *g, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyUnicode_CheckExact(args[0]) || !PyBytes_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "put(topic, frame, record: bytes)");
        return NULL;
    }
    PyObject *view = new_view(g);
    if (view == NULL)
        return NULL;
    PyObject *fr = open_frame(g, args[0]);
    if (fr != args[1]) {
        Py_DECREF(view);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *out = append(g, fr, view, PyBytes_GET_SIZE(args[2]), PyBytes_AS_STRING(args[2]));
    if (out == NULL) {
        Py_DECREF(view);
        return NULL;
    }
    return out;
}

/* take(topic) -> the open frame of topic, taken (counted in flight), or None. */
static PyObject *gather_take(Gather *g, PyObject *topic)
{
    PyObject *fr = PyDict_GetItemWithError(g->open, topic);
    if (fr == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(fr);
    if (PyDict_DelItem(g->open, topic) < 0) {
        Py_DECREF(fr);
        return NULL;
    }
    if (g->due == fr)
        Py_CLEAR(g->due);
    g->inflight++;
    return fr;
}

/* take_due() -> the frame ``add`` or ``put`` marked due, taken, if it is still open; else None. */
static PyObject *gather_take_due(Gather *g, PyObject *unused)
{
    (void)unused;
    PyObject *fr = g->due;
    if (fr == NULL)
        Py_RETURN_NONE;
    g->due = NULL;
    PyObject *topic = NULL;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(g->open, &pos, &k, &v))
        if (v == fr) {
            topic = k;
            break;
        }
    PyObject *out = topic != NULL ? gather_take(g, topic) : Py_NewRef(Py_None);
    Py_DECREF(fr);
    return out;
}

/* take_all() -> every open frame, taken. */
static PyObject *gather_take_all(Gather *g, PyObject *unused)
{
    (void)unused;
    PyObject *frames = PyDict_Values(g->open);
    if (frames == NULL)
        return NULL;
    PyDict_Clear(g->open);
    Py_CLEAR(g->due);
    g->inflight += PyList_GET_SIZE(frames);
    return frames;
}

static PyObject *gather_answered(Gather *g, PyObject *unused)
{
    (void)unused;
    if (g->inflight > 0)
        g->inflight--;
    Py_RETURN_NONE;
}

static int gather_traverse(Gather *g, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(g));
    Py_VISIT(g->open);
    Py_VISIT(g->topics);
    Py_VISIT(g->frame_type);
    Py_VISIT(g->view_type);
    Py_VISIT(g->uid_source);
    Py_VISIT(g->host);
    Py_VISIT(g->tags_name);
    Py_VISIT(g->uniq_name);
    Py_VISIT(g->due);
    return 0;
}

static int gather_clear(Gather *g)
{
    Py_CLEAR(g->open);
    Py_CLEAR(g->topics);
    Py_CLEAR(g->frame_type);
    Py_CLEAR(g->view_type);
    Py_CLEAR(g->uid_source);
    Py_CLEAR(g->host);
    Py_CLEAR(g->tags_name);
    Py_CLEAR(g->uniq_name);
    Py_CLEAR(g->due);
    return 0;
}

static void gather_dealloc(Gather *g)
{
    PyTypeObject *t = Py_TYPE(g);
    PyObject_GC_UnTrack(g);
    gather_clear(g);
    t->tp_free((PyObject *)g);
    Py_DECREF(t);
}

static PyMethodDef gather_methods[] = {
    {"add", (PyCFunction)gather_add, METH_O, "A plain message onto its topic's open frame: its view, or None."},
    {"put", (PyCFunction)(void (*)(void))gather_put, METH_FASTCALL,
     "put(topic, frame, record): an encoded record onto the open frame: its view, or None."},
    {"take", (PyCFunction)gather_take, METH_O, "take(topic): the topic's open frame, taken for publishing."},
    {"take_due", (PyCFunction)gather_take_due, METH_NOARGS, "The frame marked due, taken, or None."},
    {"take_all", (PyCFunction)gather_take_all, METH_NOARGS, "Every open frame, taken."},
    {"answered", (PyCFunction)gather_answered, METH_NOARGS, "A taken frame was answered (or failed)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef gather_members[] = {
    {"open", T_OBJECT, offsetof(Gather, open), READONLY, "topic -> its open frame"},
    {"topics", T_OBJECT, offsetof(Gather, topics), READONLY, "topic -> its bytes, validated by Python"},
    {"due", T_OBJECT, offsetof(Gather, due), READONLY, "the frame that must go out now, or None"},
    {"inflight", T_LONGLONG, offsetof(Gather, inflight), READONLY, "frames taken and not answered"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot gather_slots[] = {
    {Py_tp_init, gather_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, gather_dealloc},
    {Py_tp_traverse, gather_traverse},
    {Py_tp_clear, gather_clear},
    {Py_tp_methods, gather_methods},
    {Py_tp_members, gather_members},
    {Py_tp_doc, "A producer's open async frames (spec: hostmq/store/gather.py PyGather)."},
    {0, NULL},
};

static PyType_Spec gather_spec = {
    .name = "hostmq.store._encode.Gather",
    .basicsize = sizeof(Gather),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = gather_slots,
};

/* The SendResult slots send_results and send_result set: their offsets in ``t`` (0), or -1 where ``t``
 * is not the slots-only class they expect (no error set). */
static int result_slots(PyObject *module, PyTypeObject *t, Py_ssize_t off[4])
{
    EncodeState *st = state_of(module);
    if (st->result_type == t) {         /* the usual call: the type checked before */
        memcpy(off, st->result_off, sizeof st->result_off);
        return 0;
    }
    static const char *const names[4] = {"status", "msg_id", "queue", "queue_offset"};
    for (int i = 0; i < 4; i++)
        if (slot_offset(t, names[i], &off[i]) < 0) {
            PyErr_Clear();
            return -1;
        }
    if (t->tp_dictoffset != 0)
        return -1;                      /* slots only, as the dataclass declares */
    memcpy(st->result_off, off, sizeof st->result_off);
    Py_INCREF(t);
    Py_XSETREF(st->result_type, t);
    return 0;
}

/* One SendResult made without running the frozen dataclass's __init__ — its four slots set as that
 * __init__ sets them; the references to status, id and queue are taken here, ``qo``'s is stolen. */
static PyObject *new_result(PyTypeObject *t, const Py_ssize_t off[4], PyObject *status, PyObject *id,
                            PyObject *queue, PyObject *qo)
{
    PyObject *r = t->tp_alloc(t, 0);
    if (r == NULL) {
        Py_DECREF(qo);
        return NULL;
    }
    *oslot(r, off[0]) = Py_NewRef(status);
    *oslot(r, off[1]) = Py_NewRef(id);
    *oslot(r, off[2]) = Py_NewRef(queue);
    *oslot(r, off[3]) = qo;
    if (PyObject_IS_GC(r) && PyObject_GC_IsTracked(r))
        PyObject_GC_UnTrack(r);     /* frozen, four leaves: never in a cycle (see new_view) */
    return r;
}

/* send_result(result_type, status, host_hex, phys, queue, queue_offset) -> result_type(status,
 * f"{host_hex}{phys:016X}", queue, queue_offset): a sync send's SendResult from its completion (the
 * spec is py_send_result in hostmq/store/gather.py). None where an argument is not the common case. */
static PyObject *send_result(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "send_result takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *rt = args[0], *host = args[2];
    long long phys, qoff;
    Py_ssize_t off[4];
    if (!PyType_Check(rt) || !PyUnicode_CheckExact(host) || !PyUnicode_IS_ASCII(host) ||
        PyUnicode_GET_LENGTH(host) > MAX_PREFIX || as_int(args[3], 0, LLONG_MAX, &phys) < 0 ||
        as_int(args[5], 0, LLONG_MAX, &qoff) < 0 || result_slots(self, (PyTypeObject *)rt, off) < 0)
        Py_RETURN_NONE;
    Py_ssize_t hn = PyUnicode_GET_LENGTH(host);
    PyObject *id = PyUnicode_New(hn + UID_HEX, 127);
    if (id == NULL)
        return NULL;
    unsigned char *o = PyUnicode_1BYTE_DATA(id);
    memcpy(o, PyUnicode_1BYTE_DATA(host), (size_t)hn);
    put_hex16(o + hn, (uint64_t)phys);
    PyObject *qo = PyLong_FromLongLong(qoff);
    if (qo == NULL) {
        Py_DECREF(id);
        return NULL;
    }
    PyObject *r = new_result((PyTypeObject *)rt, off, args[1], id, args[4], qo);
    Py_DECREF(id);
    return r;
}

/* send_results(result_type, status, ids, queue, first_offset) -> [result_type(status, ids[i], queue,
 * first_offset + i) ...]: an async frame's SendResults (the spec is py_send_results in
 * hostmq/store/gather.py), each made without running the frozen dataclass's __init__ — its four
 * slots set as that __init__ sets them. None where an argument is not the common case. */
static PyObject *send_results(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "send_results takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *rt = args[0], *status = args[1], *ids = args[2], *queue = args[3];
    long long first;
    if (!PyType_Check(rt) || !PyList_CheckExact(ids) || as_int(args[4], 0, LLONG_MAX / 2, &first) < 0)
        Py_RETURN_NONE;
    PyTypeObject *t = (PyTypeObject *)rt;
    Py_ssize_t off[4];
    if (result_slots(self, t, off) < 0)
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(ids);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyList_GET_ITEM(ids, i);
        if (!PyUnicode_CheckExact(id)) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        PyObject *qo = PyLong_FromLongLong(first + i), *r = qo == NULL ? NULL : new_result(t, off, status, id, queue, qo);
        if (r == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, r);
    }
    return out;
}

/* crc32(data) -> zlib.crc32(data), computed as the records' body CRC is (crc32_fast.h): for the tests. */
static PyObject *crc32_of(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    uint32_t c = hm_crc32_any(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

/* _bind(message_type): the slot offsets of hostmq.message.Message (called by hostmq/store/encode.py). */
static PyObject *bind(PyObject *self, PyObject *arg)
{
    EncodeState *st = state_of(self);
    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "_bind takes the Message class");
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)arg;
    Py_ssize_t offset[S_COUNT];
    for (int s = 0; s < S_COUNT; s++)
        if (slot_offset(t, slot_names[s], &offset[s]) < 0)
            return NULL;
    memcpy(st->offset, offset, sizeof offset);
    Py_INCREF(arg);
    Py_XSETREF(st->message_type, t);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"encode_messages", (PyCFunction)(void (*)(void))encode_messages, METH_FASTCALL,
     "encode.py_encode_messages in C for the common case: (payload, sizes), or None (ask the spec)."},
    {"batch_msg_ids", (PyCFunction)(void (*)(void))batch_msg_ids, METH_FASTCALL,
     "encode.py_batch_msg_ids in C: a batch's comma-separated message ids, or None (ask the spec)."},
    {"restamp", (PyCFunction)(void (*)(void))restamp, METH_FASTCALL,
     "encode.py_restamp in C: the records with their queue id and store host set, or None (ask the spec)."},
    {"send_result", (PyCFunction)(void (*)(void))send_result, METH_FASTCALL,
     "A sync send's SendResult from its completion in one call, or None (ask the spec)."},
    {"send_results", (PyCFunction)(void (*)(void))send_results, METH_FASTCALL,
     "An async frame's SendResults in one call, or None (ask the spec)."},
    {"crc32", crc32_of, METH_O, "zlib.crc32(data) as the native code computes body CRCs (for the tests)."},
    {"_bind", bind, METH_O, "Take Message's slot offsets (hostmq.store.encode calls it at import)."},
    {NULL, NULL, 0, NULL},
};

static int encode_traverse(PyObject *m, visitproc visit, void *arg)
{
    EncodeState *st = state_of(m);
    if (st != NULL) {
        Py_VISIT(st->message_type);
        Py_VISIT(st->result_type);
    }
    return 0;
}

static int encode_clear(PyObject *m)
{
    EncodeState *st = state_of(m);
    if (st != NULL) {
        Py_CLEAR(st->message_type);
        Py_CLEAR(st->result_type);
    }
    return 0;
}

static void encode_free(void *m) { encode_clear((PyObject *)m); }

/* LAYOUT: what this module writes, as records.py names it (compared by hostmq/store/encode.py at import). */
static int encode_exec(PyObject *m)
{
    hm_crc32_init();
    state_of(m)->message_type = NULL;
    state_of(m)->result_type = NULL;
    PyObject *lay = Py_BuildValue(
        "{s:i,s:k,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}",
        "MSG_HEADER", HDR_BYTES, "MAGIC_CODE", (unsigned long)MAGIC_CODE, "PROPERTY_END", PROPERTY_END,
        "NAME_VALUE_SEP", NAME_VALUE_SEP, "HOST_BYTES", HOST_BYTES, "total_size", OFF_TOTAL_SIZE,
        "magic", OFF_MAGIC, "body_crc", OFF_BODY_CRC, "queue_id", OFF_QUEUE_ID, "flag", OFF_FLAG,
        "born_ts_ms", OFF_BORN_TS_MS, "born_host", OFF_BORN_HOST, "store_host", OFF_STORE_HOST,
        "body_length", OFF_BODY_LENGTH);
    if (lay == NULL || PyModule_AddObjectRef(m, "LAYOUT", lay) < 0) {
        Py_XDECREF(lay);
        return -1;
    }
    Py_DECREF(lay);
#ifdef HM_CRC_PCLMUL
    int folded = hm_crc_pclmul;
#else
    int folded = 0;
#endif
    if (PyModule_AddIntConstant(m, "CRC32_FOLDED", folded) < 0)     /* crc32 uses PCLMULQDQ from 64 bytes */
        return -1;
    PyObject *gt = PyType_FromModuleAndSpec(m, &gather_spec, NULL);
    if (gt == NULL || PyModule_AddObjectRef(m, "Gather", gt) < 0) {
        Py_XDECREF(gt);
        return -1;
    }
    Py_DECREF(gt);
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, encode_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hostmq.store._encode",
    .m_doc = "A producer's messages as records in one call (see hostmq/store/_encode.c).",
    .m_size = sizeof(EncodeState),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = encode_traverse,
    .m_clear = encode_clear,
    .m_free = encode_free,
};

PyMODINIT_FUNC PyInit__encode(void)
{
    return PyModuleDef_Init(&module);
}
