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
        PyObject *m = PyList_GET_ITEM(msgs, got);
        if (!Py_IS_TYPE(m, st->message_type))
            goto ask_spec;
        PyObject *v[S_COUNT];
        for (int s = 0; s < S_COUNT; s++)
            if ((v[s] = slot(m, st->offset[s])) == NULL)          /* a deleted attribute */
                goto ask_spec;
        if (v[S_TOPIC] != topic) {
            if (!PyUnicode_CheckExact(v[S_TOPIC]))
                goto ask_spec;
            int c = PyUnicode_Compare(v[S_TOPIC], topic);
            if (c != 0) {
                PyErr_Clear();
                goto ask_spec;
            }
        }
        long long flag, delay;
        if (!PyBytes_CheckExact(v[S_BODY]) || as_int(v[S_FLAG], INT32_MIN, INT32_MAX, &flag) < 0 ||
            as_int(v[S_DELAY], 0, 0, &delay) < 0 || !empty(v[S_KEYS]) || !empty(v[S_PROPERTIES]))
            goto ask_spec;
        Item *it = &items[got];
        it->body_len = PyBytes_GET_SIZE(v[S_BODY]);
        if (it->body_len < 1 || it->body_len > max_body)
            goto ask_spec;
        it->flag = (int32_t)flag;
        Py_ssize_t plen = uniq_part;
        if (v[S_TAGS] != Py_None) {
            if (!PyUnicode_CheckExact(v[S_TAGS]))
                goto ask_spec;
            it->tags_utf8 = PyUnicode_AsUTF8AndSize(v[S_TAGS], &it->tags_len);
            if (it->tags_utf8 == NULL) {               /* a lone surrogate: the spec's encode raises */
                PyErr_Clear();
                goto ask_spec;
            }
            if (memchr(it->tags_utf8, '\x01', (size_t)it->tags_len) || memchr(it->tags_utf8, '\x02', (size_t)it->tags_len))
                goto ask_spec;
            plen += tn + 1 + it->tags_len + 1;
            it->tags = Py_NewRef(v[S_TAGS]);
        }
        if (plen > max_props)
            goto ask_spec;
        it->body = Py_NewRef(v[S_BODY]);
        long long size = (long long)HDR_BYTES + it->body_len + TOPIC_LEN_BYTES + tlen + PROPS_LEN_BYTES + plen;
        if (size > INT32_MAX)
            goto ask_spec;
        it->size = (uint32_t)size;
        total += size;
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
        PyObject *c = PyObject_CallNoArgs(uid_next);
        if (c == NULL)
            goto failed;
        unsigned long long u = PyLong_Check(c) ? PyLong_AsUnsignedLongLong(c) : (unsigned long long)-1;
        int bad = PyErr_Occurred() != NULL || !PyLong_Check(c);
        Py_DECREF(c);
        if (bad) {
            PyErr_Clear();
            PyErr_SetString(PyExc_OverflowError, "the unique id counter is not a 64-bit unsigned int");
            goto failed;
        }
        uids[i] = u;
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
    for (Py_ssize_t i = 0; i < n; i++) {
        Item *it = &items[i];
        const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(it->body);
        memset(o, 0, HDR_BYTES);
        put32(o + OFF_TOTAL_SIZE, it->size);
        put32(o + OFF_MAGIC, MAGIC_CODE);
        put32(o + OFF_BODY_CRC, (uint32_t)crc32(0L, body, (uInt)it->body_len) & 0x7FFFFFFFu);
        put32(o + OFF_QUEUE_ID, (uint32_t)queue_id);
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
        put_hex16(p, uids[i]);
        p += UID_HEX;
        *p++ = (unsigned char)PROPERTY_END;
        put16(plen_at, (uint16_t)(p - props));
        o = p;
    }
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
    for (int s = 0; s < S_COUNT; s++) {
        PyObject *d = PyDict_GetItemString(t->tp_dict, slot_names[s]);     /* borrowed */
        if (d == NULL || !PyObject_TypeCheck(d, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", t->tp_name, slot_names[s]);
            return NULL;
        }
        offset[s] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
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
    {"_bind", bind, METH_O, "Take Message's slot offsets (hostmq.store.encode calls it at import)."},
    {NULL, NULL, 0, NULL},
};

static int encode_traverse(PyObject *m, visitproc visit, void *arg)
{
    EncodeState *st = state_of(m);
    if (st != NULL)
        Py_VISIT(st->message_type);
    return 0;
}

static int encode_clear(PyObject *m)
{
    EncodeState *st = state_of(m);
    if (st != NULL)
        Py_CLEAR(st->message_type);
    return 0;
}

static void encode_free(void *m) { encode_clear((PyObject *)m); }

/* LAYOUT: what this module writes, as records.py names it (compared by hostmq/store/encode.py at import). */
static int encode_exec(PyObject *m)
{
    state_of(m)->message_type = NULL;
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
