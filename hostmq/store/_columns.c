/* hostmq.store._columns: the records of a zero-copy batch as Arrow column buffers, for the Spark reader.
 *
 * The pure-Python path is the spec: ``hostmq.spark.scan.batch_columns`` (``MessageBatch.headers`` and
 * ``bodies_and_properties`` of hostmq/store/reader.py, ``records.decode_properties`` for each record's
 * properties) and ``arrow_batch``. ``columns()`` builds the same values in one call with no Python
 * object per message: for n records, the buffers of Arrow's layouts (native-order int64 and int32
 * arrays, validity bitmaps, offsets + data of strings, lists and maps) as ``bytes`` objects, which
 * ``scan.native_arrow_batch`` wraps without copying. The mapped commitlog files are held through the
 * buffer protocol for the whole call and read in two passes with the GIL released: the first checks
 * each record's lengths, fills the fixed-width columns, inflates compressed bodies and bounds what
 * the rest can take; the other columns' bytes objects are allocated at those bounds, written in
 * place by the second pass and shrunk to what was written (no copy of the data afterwards).
 *
 * Every byte of a record was written by a client or may change while it is read: each length is
 * bounded by the record (its consume-queue size) and the record by its mapping, and each record's
 * properties are copied before they are parsed. This module decides only the common case; for any
 * record it cannot read exactly as the spec reads it — a length that leaves the record, properties
 * ``decode_properties`` refuses or reads in a way not mirrored here (a name given twice, more than
 * MAX_PAIRS pairs), a body that does not inflate, a column past Arrow's int32 offsets — it returns
 * None and the caller hands the whole batch to the spec, which then gives its own outcome (rows or
 * the error). tests/store/test_columns_native.py compares the two on real store files.
 *
 * The layout is records.py's, from the generated include/record_layout.h (LAYOUT below is compared
 * with records.FIELD at import by scan.py). Stateless: nothing here sleeps, logs or retries.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../include/record_layout.h"
#include "../include/record_check.h"

#define LAYOUT_HOLDS(cond) _Static_assert(cond, "hostmq/include/record_layout.h: " #cond)
LAYOUT_HOLDS(W_QUEUE_OFFSET == 8 && W_PHYS_OFFSET == 8 && W_STORE_HOST == 8 && W_SYS_FLAG == 4);
LAYOUT_HOLDS(W_BORN_TS_MS == 8 && W_STORE_TS_MS == 8 && W_BODY_LENGTH == 4);
LAYOUT_HOLDS(HDR_BYTES == OFF_BODY_LENGTH + W_BODY_LENGTH);
LAYOUT_HOLDS(TOPIC_LEN_BYTES == 1 && PROPS_LEN_BYTES == 2);

#define MAX_PAIRS 64            /* kept pairs per record compared pairwise for a repeated name */
#define MSG_ID_CHARS 32         /* STOREHOST + PHYSICALOFFSET as upper-case hex */
#define MAX_PROPS_BYTES 0xFFFF  /* PROPERTIESLENGTH is a u16 */

enum { COLS_OK = 0, COLS_ASK = 1, COLS_NOMEM = 2 };

/* The names and flags the spec reads records with (records.PROP_TAGS, PROP_KEYS, KEY_SEPARATOR,
 * SYSFLAG_COMPRESSED), passed by the caller. */
typedef struct {
    const unsigned char *tags, *keys;
    size_t tags_len, keys_len;
    unsigned char key_sep;
    uint32_t compressed_flag;
} Names;

/* A growable malloc buffer (used with the GIL released): the inflated bodies. */
typedef struct {
    unsigned char *p;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t more)
{
    if (more <= b->cap - b->len)
        return 0;
    size_t want = b->cap ? b->cap : 4096;
    while (want - b->len < more) {
        if (want > SIZE_MAX / 2)
            return -1;
        want *= 2;
    }
    unsigned char *q = realloc(b->p, want);
    if (q == NULL)
        return -1;
    b->p = q;
    b->cap = want;
    return 0;
}

/* An output column: a bytes object of ``cap`` bytes (the measuring pass's upper bound), written in
 * place with the GIL released and shrunk to ``len`` at the end. */
typedef struct {
    PyObject *obj;
    unsigned char *p;
    size_t len, cap;
} Out;

static inline int out_put(Out *o, const void *src, size_t n)
{
    if (n > o->cap - o->len)
        return COLS_ASK;        /* past the bound measured (cannot happen: the bound is from the same copy) */
    memcpy(o->p + o->len, src, n);
    o->len += n;
    return COLS_OK;
}

/* Append a string to a string column: its data, then the int32 offset after it. */
static inline int out_string(Out *off, Out *data, const unsigned char *s, size_t n)
{
    if (out_put(data, s, n) != COLS_OK)
        return COLS_ASK;
    int32_t end = (int32_t)data->len;       /* data->cap <= INT32_MAX */
    return out_put(off, &end, sizeof end);
}

/* Where one record's parts lie, from the measuring pass: its body (or the span of ``inflated``
 * holding it inflated) and its properties. */
typedef struct {
    const unsigned char *body, *props;
    int64_t body_len, props_len, inflated_at;   /* inflated_at < 0: not compressed */
} Span;

/* The columns being built: fixed-width ones (n or n + 1 entries) first, the others once measured. */
typedef struct {
    int64_t *queue_offset, *born_us, *store_us;
    unsigned char *msg_id, *tag_valid;
    int32_t *body_off, *tag_off, *keys_off, *map_off;
    int64_t tag_nulls;
    Span *spans;
    Buf inflated;
    int64_t body_bytes, props_bytes, pairs_bound, keys_bound;
    Out body, tag, key_off, key, name_off, name, value_off, value;
    z_stream zs;
    int zs_ready;
} Cols;

/* Inflate ``n`` bytes at ``src`` as zlib.decompress does (one zlib stream; what follows its end is
 * ignored) onto ``c->inflated``. COLS_ASK where zlib.decompress raises or past INT32_MAX bytes. */
static int inflate_onto(Cols *c, const unsigned char *src, int64_t n)
{
    z_stream *zs = &c->zs;
    if (!c->zs_ready) {
        memset(zs, 0, sizeof *zs);
        if (inflateInit(zs) != Z_OK)
            return COLS_NOMEM;
        c->zs_ready = 1;
    } else if (inflateReset(zs) != Z_OK) {
        return COLS_ASK;
    }
    zs->next_in = (Bytef *)src;
    zs->avail_in = (uInt)n;             /* n < 2^31: a BODYLENGTH */
    Buf *out = &c->inflated;
    for (;;) {
        if (out->len > INT32_MAX)
            return COLS_ASK;
        size_t left = (size_t)INT32_MAX + 1 - out->len;   /* a bomb stops here */
        size_t ask = (size_t)n * 4 + 256;
        if (buf_reserve(out, ask < left ? ask : left) < 0)
            return COLS_NOMEM;
        size_t room = out->cap - out->len;
        if (room > left)
            room = left;
        zs->next_out = out->p + out->len;
        zs->avail_out = (uInt)room;         /* <= 2^31 */
        int err = inflate(zs, Z_NO_FLUSH);
        out->len = (size_t)(zs->next_out - out->p);
        if (err == Z_STREAM_END)
            return out->len > INT32_MAX ? COLS_ASK : COLS_OK;
        if (err == Z_MEM_ERROR)
            return COLS_NOMEM;
        if (err != Z_OK)                /* truncated (Z_BUF_ERROR: output room was given), bad data, a dictionary */
            return COLS_ASK;
    }
}

static const char HEX[] = "0123456789ABCDEF";

/* Measuring pass over record ``i`` — the ``size`` bytes at ``pos`` of ``mm[0..mm_len)``, ``tlen`` the
 * queue's topic bytes (the spec finds PROPERTIESLENGTH at BODY + body length + 1 + tlen): its
 * fixed-width columns, where its body and properties lie (each inside the record, or COLS_ASK),
 * compressed bodies inflated, and the bounds of what its properties can add. */
static int measure_record(Cols *c, const Names *nm, int64_t i, const unsigned char *mm, int64_t mm_len, int64_t pos,
                          int64_t size, int64_t tlen)
{
    if (pos < 0 || size < HDR_BYTES || pos > mm_len || size > mm_len - pos)
        return COLS_ASK;
    const unsigned char *r = mm + pos;
    c->queue_offset[i] = (int64_t)be64(r + OFF_QUEUE_OFFSET);
    c->born_us[i] = (int64_t)(be64(r + OFF_BORN_TS_MS) * 1000u);       /* wraps as numpy's int64 product */
    c->store_us[i] = (int64_t)(be64(r + OFF_STORE_TS_MS) * 1000u);
    unsigned char *id = c->msg_id + i * MSG_ID_CHARS;
    for (int k = 0; k < 8; k++) {
        unsigned char h = r[OFF_STORE_HOST + k], o = r[OFF_PHYS_OFFSET + k];
        id[2 * k] = (unsigned char)HEX[h >> 4];
        id[2 * k + 1] = (unsigned char)HEX[h & 15];
        id[16 + 2 * k] = (unsigned char)HEX[o >> 4];
        id[16 + 2 * k + 1] = (unsigned char)HEX[o & 15];
    }
    int64_t blen = (int32_t)be32(r + OFF_BODY_LENGTH);
    if (blen < 0 || blen > size - HDR_BYTES)
        return COLS_ASK;
    int64_t plen_at = HDR_BYTES + blen + TOPIC_LEN_BYTES + tlen;
    if (plen_at > size - PROPS_LEN_BYTES)
        return COLS_ASK;
    int64_t plen = be16(r + plen_at), pstart = plen_at + PROPS_LEN_BYTES;
    if (plen > size - pstart)
        return COLS_ASK;
    Span *sp = &c->spans[i];
    *sp = (Span){r + HDR_BYTES, r + pstart, blen, plen, -1};
    if (be32(r + OFF_SYS_FLAG) & nm->compressed_flag) {
        sp->inflated_at = (int64_t)c->inflated.len;
        int rc = inflate_onto(c, r + HDR_BYTES, blen);
        if (rc != COLS_OK)
            return rc;
        sp->body_len = (int64_t)c->inflated.len - sp->inflated_at;
    }
    c->body_bytes += sp->body_len;
    c->props_bytes += plen;
    c->pairs_bound += plen / 3 + 1;             /* a kept pair takes 3 bytes and a separator */
    c->keys_bound += (plen + 1) / 2;            /* a key takes a byte and a separator */
    return c->body_bytes > INT32_MAX || c->props_bytes > INT32_MAX || c->pairs_bound > INT32_MAX / 4 ||
           c->keys_bound > INT32_MAX / 4 ? COLS_ASK : COLS_OK;
}

/* 1 if every byte of p[0..n) is ASCII (then it is UTF-8). */
static int all_ascii(const unsigned char *p, int64_t n)
{
    int64_t i = 0;
    uint64_t acc = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        acc |= w;
    }
    for (; i < n; i++)
        acc |= p[i];
    return (acc & 0x8080808080808080ull) == 0;
}

/* Record ``i``'s properties ``p[0..n)`` (a private copy) into the map, tags and keys columns, as
 * decode_properties reads them: strict UTF-8; "\x02"-separated pairs, empty ones skipped; a name
 * before the first "\x01" (absent or empty: refused); a pair with an empty value dropped. A name
 * kept twice (the spec keeps the last value at the first one's place) is left to the spec. */
static int put_properties(Cols *c, const Names *nm, int64_t i, const unsigned char *p, int64_t n)
{
    const unsigned char *name_at[MAX_PAIRS], *value_at[MAX_PAIRS];
    int64_t name_len[MAX_PAIRS], value_len[MAX_PAIRS];
    int pairs = 0;
    if (!all_ascii(p, n) && !utf8_valid(p, n))
        return COLS_ASK;
    for (int64_t start = 0; start < n;) {
        const unsigned char *e = memchr(p + start, PROPERTY_END, (size_t)(n - start));
        int64_t end = e ? e - p : n;
        if (end > start) {
            const unsigned char *s = memchr(p + start, NAME_VALUE_SEP, (size_t)(end - start));
            if (s == NULL || s == p + start)
                return COLS_ASK;        /* the spec raises CorruptRecordError */
            int64_t nlen = s - (p + start), vlen = end - (s - p) - 1;
            if (vlen > 0) {
                if (pairs == MAX_PAIRS)
                    return COLS_ASK;
                for (int k = 0; k < pairs; k++)
                    if (name_len[k] == nlen && memcmp(name_at[k], p + start, (size_t)nlen) == 0)
                        return COLS_ASK;
                name_at[pairs] = p + start;
                name_len[pairs] = nlen;
                value_at[pairs] = s + 1;
                value_len[pairs++] = vlen;
            }
        }
        start = end + 1;
    }
    const unsigned char *tags = NULL, *keys = NULL;
    int64_t tags_len = 0, keys_len = 0;
    for (int k = 0; k < pairs; k++) {
        if (out_string(&c->name_off, &c->name, name_at[k], (size_t)name_len[k]) != COLS_OK ||
            out_string(&c->value_off, &c->value, value_at[k], (size_t)value_len[k]) != COLS_OK)
            return COLS_ASK;
        if ((size_t)name_len[k] == nm->tags_len && memcmp(name_at[k], nm->tags, nm->tags_len) == 0) {
            tags = value_at[k];
            tags_len = value_len[k];
        } else if ((size_t)name_len[k] == nm->keys_len && memcmp(name_at[k], nm->keys, nm->keys_len) == 0) {
            keys = value_at[k];
            keys_len = value_len[k];
        }
    }
    c->map_off[i + 1] = c->map_off[i] + pairs;
    if (tags != NULL) {
        c->tag_valid[i >> 3] |= (unsigned char)(1u << (i & 7));
        if (out_put(&c->tag, tags, (size_t)tags_len) != COLS_OK)
            return COLS_ASK;
    } else {
        c->tag_nulls++;
    }
    c->tag_off[i + 1] = (int32_t)c->tag.len;
    int32_t nkeys = 0;
    for (int64_t a = 0; a < keys_len;) {        /* split on KEY_SEPARATOR, empty pieces dropped */
        const unsigned char *e = memchr(keys + a, nm->key_sep, (size_t)(keys_len - a));
        int64_t b = e ? e - keys : keys_len;
        if (b > a) {
            if (out_string(&c->key_off, &c->key, keys + a, (size_t)(b - a)) != COLS_OK)
                return COLS_ASK;
            nkeys++;
        }
        a = b + 1;
    }
    c->keys_off[i + 1] = c->keys_off[i] + nkeys;
    return COLS_OK;
}

/* Filling pass over record ``i`` (its Span measured): body, then properties parsed from a private
 * copy (``scratch``, 64 KiB) — the mapping may change meanwhile, the copy does not. */
static int fill_record(Cols *c, const Names *nm, int64_t i, unsigned char *scratch)
{
    const Span *sp = &c->spans[i];
    const unsigned char *body = sp->inflated_at < 0 ? sp->body : c->inflated.p + sp->inflated_at;
    if (out_put(&c->body, body, (size_t)sp->body_len) != COLS_OK)
        return COLS_ASK;
    c->body_off[i + 1] = (int32_t)c->body.len;
    memcpy(scratch, sp->props, (size_t)sp->props_len);
    return put_properties(c, nm, i, scratch, sp->props_len);
}

static int get_buffer(PyObject *o, Py_buffer *v, const char *what)
{
    if (PyObject_GetBuffer(o, v, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous buffer", what);
        return -1;
    }
    return 0;
}

/* ``o`` as a new bytes object of ``cap`` bytes to write in place; -1 with an error set. */
static int out_new(Out *o, int64_t cap)
{
    o->obj = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
    if (o->obj == NULL)
        return -1;
    o->p = (unsigned char *)PyBytes_AS_STRING(o->obj);
    o->len = 0;
    o->cap = (size_t)cap;
    return 0;
}

/* Parse the Python arguments: files, file index, positions, sizes. 0, or -1 with an error set. */
typedef struct {
    Py_buffer *files, index, pos, sizes;
    Py_ssize_t nfiles, n;
    int have_index;
} Args;

static void release_args(Args *a)
{
    for (Py_ssize_t k = 0; k < a->nfiles; k++)
        PyBuffer_Release(&a->files[k]);
    PyMem_Free(a->files);
    if (a->have_index)
        PyBuffer_Release(&a->index);
    if (a->pos.obj != NULL)
        PyBuffer_Release(&a->pos);
    if (a->sizes.obj != NULL)
        PyBuffer_Release(&a->sizes);
}

static int get_args(PyObject *mms, PyObject *index, PyObject *pos, PyObject *sizes, Args *a)
{
    memset(a, 0, sizeof *a);
    if (!PyTuple_Check(mms)) {
        PyErr_SetString(PyExc_TypeError, "columns(): mms must be a tuple of buffers");
        return -1;
    }
    Py_ssize_t nf = PyTuple_GET_SIZE(mms);
    a->files = PyMem_Calloc(nf ? (size_t)nf : 1, sizeof(Py_buffer));
    if (a->files == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (; a->nfiles < nf; a->nfiles++)
        if (get_buffer(PyTuple_GET_ITEM(mms, a->nfiles), &a->files[a->nfiles], "mms[k]") < 0)
            return -1;
    if (get_buffer(pos, &a->pos, "pos") < 0 || get_buffer(sizes, &a->sizes, "sizes") < 0)
        return -1;
    if (index != Py_None) {
        if (get_buffer(index, &a->index, "file_index") < 0)
            return -1;
        a->have_index = 1;
    }
    a->n = a->pos.len / 8;
    if (a->pos.len % 8 || a->sizes.len != a->pos.len || (a->have_index && a->index.len != a->pos.len) ||
        (a->n && nf == 0) || (!a->have_index && nf > 1)) {
        PyErr_SetString(PyExc_ValueError, "columns(): pos, sizes (and file_index) must be int64 rows of one length");
        return -1;
    }
    if (a->have_index) {
        const int64_t *f = a->index.buf;
        for (Py_ssize_t i = 0; i < a->n; i++)
            if (f[i] < 0 || f[i] >= nf) {
                PyErr_SetString(PyExc_ValueError, "columns(): a file_index names no buffer of mms");
                return -1;
            }
    }
    return 0;
}

static int get_names(PyObject *const *args, Names *nm)
{
    if (!PyBytes_Check(args[0]) || !PyBytes_Check(args[1]) || !PyBytes_Check(args[2]) ||
        PyBytes_GET_SIZE(args[2]) != 1) {
        PyErr_SetString(PyExc_TypeError, "columns(): tags_name and keys_name bytes, key_sep one byte");
        return -1;
    }
    unsigned long flag = PyLong_AsUnsignedLong(args[3]);
    if (flag == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    nm->tags = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    nm->tags_len = (size_t)PyBytes_GET_SIZE(args[0]);
    nm->keys = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    nm->keys_len = (size_t)PyBytes_GET_SIZE(args[1]);
    nm->key_sep = (unsigned char)PyBytes_AS_STRING(args[2])[0];
    nm->compressed_flag = (uint32_t)flag;
    return 0;
}

enum { FIX_QOFF, FIX_BORN, FIX_STORE, FIX_ID, FIX_BODY_OFF, FIX_TAG_VALID, FIX_TAG_OFF, FIX_KEYS_OFF, FIX_MAP_OFF,
       N_FIXED };
enum { GROWN_BODY, GROWN_TAG, GROWN_KEY_OFF, GROWN_KEY, GROWN_NAME_OFF, GROWN_NAME, GROWN_VALUE_OFF, GROWN_VALUE,
       N_GROWN };

static Out *grown_of(Cols *c, int k)
{
    Out *all[N_GROWN] = {&c->body, &c->tag, &c->key_off, &c->key, &c->name_off, &c->name, &c->value_off, &c->value};
    return all[k];
}

/* The fixed-width columns of n records; -1 with an error set. */
static int new_fixed(Cols *c, Out *fixed, Py_ssize_t n)
{
    Py_ssize_t widths[N_FIXED] = {8 * n, 8 * n, 8 * n, MSG_ID_CHARS * n, 4 * (n + 1), (n + 7) / 8, 4 * (n + 1),
                                  4 * (n + 1), 4 * (n + 1)};
    for (int k = 0; k < N_FIXED; k++)
        if (out_new(&fixed[k], widths[k]) < 0)
            return -1;
    c->queue_offset = (int64_t *)fixed[FIX_QOFF].p;
    c->born_us = (int64_t *)fixed[FIX_BORN].p;
    c->store_us = (int64_t *)fixed[FIX_STORE].p;
    c->msg_id = fixed[FIX_ID].p;
    c->tag_valid = fixed[FIX_TAG_VALID].p;
    memset(c->tag_valid, 0, (size_t)widths[FIX_TAG_VALID]);
    int32_t **offs[] = {&c->body_off, &c->tag_off, &c->keys_off, &c->map_off};
    int at[] = {FIX_BODY_OFF, FIX_TAG_OFF, FIX_KEYS_OFF, FIX_MAP_OFF};
    for (int k = 0; k < 4; k++) {
        *offs[k] = (int32_t *)fixed[at[k]].p;
        (*offs[k])[0] = 0;
    }
    return 0;
}

/* The other columns, at the bounds measured; -1 with an error set. */
static int new_grown(Cols *c)
{
    int64_t caps[N_GROWN] = {c->body_bytes, c->props_bytes, 4 * (c->keys_bound + 1), c->props_bytes,
                             4 * (c->pairs_bound + 1), c->props_bytes, 4 * (c->pairs_bound + 1), c->props_bytes};
    for (int k = 0; k < N_GROWN; k++)
        if (out_new(grown_of(c, k), caps[k]) < 0)
            return -1;
    int32_t zero = 0;
    out_put(&c->key_off, &zero, 4);
    out_put(&c->name_off, &zero, 4);
    out_put(&c->value_off, &zero, 4);
    return 0;
}

/* The result tuple (see columns()) of the columns shrunk to what was written; NULL with an error. */
static PyObject *result_of(Cols *c, Out *fixed)
{
    for (int k = 0; k < N_GROWN; k++) {
        Out *o = grown_of(c, k);
        if (_PyBytes_Resize(&o->obj, (Py_ssize_t)o->len) < 0)      /* on failure o->obj is NULL */
            return NULL;
    }
    return Py_BuildValue("(OOOOOOOLOOOOOOOOOO)", fixed[FIX_QOFF].obj, fixed[FIX_BORN].obj, fixed[FIX_STORE].obj,
                         fixed[FIX_ID].obj, fixed[FIX_BODY_OFF].obj, c->body.obj, fixed[FIX_TAG_VALID].obj,
                         (long long)c->tag_nulls, fixed[FIX_TAG_OFF].obj, c->tag.obj, fixed[FIX_KEYS_OFF].obj,
                         c->key_off.obj, c->key.obj, fixed[FIX_MAP_OFF].obj, c->name_off.obj, c->name.obj,
                         c->value_off.obj, c->value.obj);
}

/* The two passes over the records, the GIL released for each; the grown columns are allocated
 * between them. COLS_* (COLS_NOMEM with or without an error set). */
static int build(Cols *c, const Names *nm, const Args *a, int64_t tlen)
{
    Py_ssize_t n = a->n;
    const int64_t *pos = a->pos.buf, *sizes = a->sizes.buf, *fi = a->have_index ? a->index.buf : NULL;
    int rc = COLS_OK;
    c->spans = malloc(sizeof(Span) * (size_t)(n ? n : 1));
    if (c->spans == NULL)
        return COLS_NOMEM;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; rc == COLS_OK && i < n; i++) {
        const Py_buffer *f = &a->files[fi ? fi[i] : 0];
        rc = measure_record(c, nm, i, f->buf, f->len, pos[i], sizes[i], tlen);
    }
    Py_END_ALLOW_THREADS
    if (rc != COLS_OK)
        return rc;
    if (new_grown(c) < 0)
        return COLS_NOMEM;
    unsigned char *scratch = malloc(MAX_PROPS_BYTES);
    if (scratch == NULL)
        return COLS_NOMEM;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; rc == COLS_OK && i < n; i++)
        rc = fill_record(c, nm, i, scratch);
    Py_END_ALLOW_THREADS
    free(scratch);
    return rc;
}

/* columns(mms, file_index, pos, sizes, topic_len, tags_name, keys_name, key_sep, compressed_flag)
 *   -> tuple of bytes, or None
 *
 * Record i is the sizes[i] bytes at pos[i] of mms[file_index[i]] (mms a tuple of buffers; file_index
 * None: all in mms[0]; int64 ``pos`` / ``sizes`` / ``file_index``). The tuple, every array native-order:
 * queue_offset int64[n], born_us int64[n], store_us int64[n], msg_id chars[32 n], body offsets
 * int32[n + 1], body data, tags validity bitmap, tags null count (int), tags offsets int32[n + 1],
 * tags data, keys list offsets int32[n + 1], key offsets int32[k + 1], key data, properties entry
 * offsets int32[n + 1], name offsets int32[m + 1], name data, value offsets int32[m + 1], value data.
 * None: a record this module does not read as the spec does — ask the spec for the whole batch. */
static PyObject *columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "columns() takes 9 arguments");
        return NULL;
    }
    Names nm;
    long long tlen = PyLong_AsLongLong(args[4]);
    if (tlen == -1 && PyErr_Occurred())
        return NULL;
    if (tlen < 0 || tlen > 0xFF) {
        PyErr_SetString(PyExc_ValueError, "columns(): topic_len must be 0..255");
        return NULL;
    }
    if (get_names(args + 5, &nm) < 0)
        return NULL;
    Args a;
    if (get_args(args[0], args[1], args[2], args[3], &a) < 0) {
        release_args(&a);
        return NULL;
    }
    Cols c;
    memset(&c, 0, sizeof c);
    Out fixed[N_FIXED];
    memset(fixed, 0, sizeof fixed);
    int rc = new_fixed(&c, fixed, a.n) < 0 ? COLS_NOMEM : build(&c, &nm, &a, tlen);
    PyObject *res = NULL;
    if (rc == COLS_OK)
        res = result_of(&c, fixed);
    else if (rc == COLS_ASK)
        res = Py_NewRef(Py_None);
    else if (!PyErr_Occurred())
        PyErr_NoMemory();
    for (int k = 0; k < N_FIXED; k++)
        Py_XDECREF(fixed[k].obj);
    for (int k = 0; k < N_GROWN; k++)
        Py_XDECREF(grown_of(&c, k)->obj);
    free(c.spans);
    free(c.inflated.p);
    if (c.zs_ready)
        inflateEnd(&c.zs);
    release_args(&a);
    return res;
}

static PyMethodDef methods[] = {
    {"columns", (PyCFunction)(void (*)(void))columns, METH_FASTCALL,
     "A batch's records as Arrow column buffers, or None: ask the spec (see hostmq/store/_columns.c)."},
    {NULL, NULL, 0, NULL},
};

static int columns_exec(PyObject *m)
{
    PyObject *lay = Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}",
                                  "queue_offset", OFF_QUEUE_OFFSET, "phys_offset", OFF_PHYS_OFFSET,
                                  "sys_flag", OFF_SYS_FLAG, "born_ts_ms", OFF_BORN_TS_MS,
                                  "store_ts_ms", OFF_STORE_TS_MS, "store_host", OFF_STORE_HOST,
                                  "body_length", OFF_BODY_LENGTH, "MSG_HEADER", HDR_BYTES,
                                  "PROPERTY_END", PROPERTY_END, "NAME_VALUE_SEP", NAME_VALUE_SEP);
    if (lay == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(m, "LAYOUT", lay);
    Py_DECREF(lay);
    return rc;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, columns_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hostmq.store._columns",
    .m_doc = "A batch's records as Arrow column buffers (see hostmq/store/_columns.c); hostmq.spark.scan uses it.",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__columns(void)
{
    return PyModuleDef_Init(&module);
}
