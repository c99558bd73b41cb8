/* hostmq/include/record_check.h: the record checks both native modules run — hostmq/_codec.c
 * (check_record, single_record) and hostmq/ingress/_step.c (the writer's step) — mirroring
 * hostmq/records.py's py_check_record and hostmq/record_check.py's py_single_record.
 * Include after Python.h and record_layout.h. Everything is static inline: no state, no GIL needed
 * (the CRC function is the caller's: the codec releases the GIL for large bodies, the step runs
 * without it). */
#ifndef HOSTMQ_RECORD_CHECK_H
#define HOSTMQ_RECORD_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { KIND_MESSAGE = 0, KIND_BLANK = 1 };      /* records.RecordKind */
#define MAX_PLAIN_PAIRS 16                  /* properties_plainly_valid compares names pairwise up to this */

typedef uint32_t (*hm_crc_fn)(const unsigned char *p, Py_ssize_t n);   /* zlib crc32 & 0x7FFFFFFF */

/* --- big-endian access ---------------------------------------------------------------------- */
static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static inline uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

static inline void put16(unsigned char *p, uint16_t v) { p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v; }

static inline void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static inline void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }


/* --- the record check (records.py_check_record) ---------------------------------------------- */
typedef struct {
    int kind;
    int32_t total;
    char why[96];
} Checked;

/* Check the record at pos (>= 0) of b[0..n) with bytes up to limit available. 0, or -1 with why. */
static inline int hm_check_core(const unsigned char *b, Py_ssize_t n, long long pos, long long limit,
                                int verify_crc, hm_crc_fn body_crc, Checked *c)
{
    if (limit > n)
        limit = n;
    if (pos > limit || limit - pos < 8) {
        snprintf(c->why, sizeof c->why, "truncated before size and magic");
        return -1;
    }
    long long room = limit - pos;
    const unsigned char *r = b + pos;
    int32_t total = (int32_t)be32(r + OFF_TOTAL_SIZE);
    uint32_t magic = be32(r + OFF_MAGIC);
    c->total = total;
    if (magic == BLANK_MAGIC_CODE) {
        if (total < MIN_BLANK_BYTES || total > room) {
            snprintf(c->why, sizeof c->why, "blank record of impossible size %d", (int)total);
            return -1;
        }
        c->kind = KIND_BLANK;
        return 0;
    }
    if (magic != MAGIC_CODE) {
        snprintf(c->why, sizeof c->why, "bad magic 0x%08X", (unsigned)magic);
        return -1;
    }
    if (total < MIN_RECORD_BYTES || total > room) {
        snprintf(c->why, sizeof c->why, "impossible total size %d (room %lld)", (int)total, room);
        return -1;
    }
    int32_t body_len = (int32_t)be32(r + OFF_BODY_LENGTH);
    if (body_len < 0 || (long long)HDR_BYTES + body_len + TOPIC_LEN_BYTES > total) {
        snprintf(c->why, sizeof c->why, "body length %d does not fit total size %d", (int)body_len, (int)total);
        return -1;
    }
    long long tpos = HDR_BYTES + (long long)body_len;              /* within the record, see above */
    long long ppos = tpos + TOPIC_LEN_BYTES + r[tpos];
    if (ppos + PROPS_LEN_BYTES > total) {
        snprintf(c->why, sizeof c->why, "topic length does not fit");
        return -1;
    }
    uint16_t props_len = be16(r + ppos);
    if (ppos + PROPS_LEN_BYTES + props_len != total) {
        snprintf(c->why, sizeof c->why, "lengths do not add up to the total size");
        return -1;
    }
    if (props_len && r[total - 1] != PROPERTY_END) {
        snprintf(c->why, sizeof c->why, "properties do not end with \\x02 (torn tail)");
        return -1;
    }
    if (verify_crc && body_crc(r + HDR_BYTES, body_len) != be32(r + OFF_BODY_CRC)) {
        snprintf(c->why, sizeof c->why, "body CRC mismatch");
        return -1;
    }
    c->kind = KIND_MESSAGE;
    return 0;
}


/* Strict UTF-8, as Python's decoder: no overlong forms, no surrogates, nothing past U+10FFFF. */
static inline int utf8_valid(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) { i++; continue; }
        int more;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c == 0xE0) { more = 2; lo = 0xA0; }
        else if (c == 0xED) { more = 2; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) more = 2;
        else if (c == 0xF0) { more = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) more = 3;
        else if (c == 0xF4) { more = 3; hi = 0x8F; }
        else return 0;
        if (n - i <= more || p[i + 1] < lo || p[i + 1] > hi)
            return 0;
        for (int k = 2; k <= more; k++)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF)
                return 0;
        i += more + 1;
    }
    return 1;
}

/* 1 if records.check_properties certainly accepts p[0..n): UTF-8, "name\x01value\x02" pairs with one
 * \x01, a non-empty name and a non-empty value each, no name twice, and no property the broker acts
 * on (its value rules are Python's). Names are compared pairwise, so a record of more than
 * MAX_PLAIN_PAIRS pairs is left to Python too. 0 means "ask check_properties", which decides (and
 * words the error). */
static inline int hm_properties_plainly_valid(const char (*reserved_marks)[32], const size_t *reserved_lens,
                                              int n_reserved, const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t name_at[MAX_PLAIN_PAIRS], name_len[MAX_PLAIN_PAIRS];
    int pairs = 0;
    if (n == 0)
        return 1;
    if (p[n - 1] != PROPERTY_END || !utf8_valid(p, n))
        return 0;
    Py_ssize_t start = 0;
    while (start < n) {
        Py_ssize_t sep = -1, i = start;
        for (; p[i] != PROPERTY_END; i++) {     /* p[n - 1] ends the scan */
            if (p[i] == NAME_VALUE_SEP) {
                if (sep >= 0)
                    return 0;
                sep = i;
            }
        }
        if (sep <= start || i == sep + 1)       /* no \x01, an empty name or an empty value */
            return 0;
        for (int k = 0; k < n_reserved; k++)
            if ((size_t)(sep + 1 - start) == reserved_lens[k] &&
                memcmp(p + start, reserved_marks[k], reserved_lens[k]) == 0)
                return 0;
        if (pairs == MAX_PLAIN_PAIRS)
            return 0;
        for (int k = 0; k < pairs; k++)
            if (name_len[k] == sep - start && memcmp(p + name_at[k], p + start, (size_t)(sep - start)) == 0)
                return 0;
        name_at[pairs] = start;
        name_len[pairs++] = sep - start;
        start = i + 1;
    }
    return 1;
}


/* --- the reserved property names (records._RESERVED_MARKS), bound by each module's _bind --------- */
#define MAX_RESERVED 16

typedef struct {
    char marks[MAX_RESERVED][32];       /* "NAME\x01" of each property the broker acts on */
    size_t lens[MAX_RESERVED];
    int n;
} HmReserved;

/* Load ``marks`` (a sequence of 1..32-byte bytes) into ``r``: 0, or -1 with a Python error set (and
 * ``r`` unchanged). The GIL must be held. */
static inline int hm_set_reserved(HmReserved *r, PyObject *marks)
{
    PyObject *seq = PySequence_Fast(marks, "reserved_property_marks must be a sequence of bytes");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_RESERVED) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many reserved property names");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyBytes_Check(m) || PyBytes_GET_SIZE(m) == 0 || PyBytes_GET_SIZE(m) > (Py_ssize_t)sizeof r->marks[0]) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "a reserved property mark must be 1..32 bytes");
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PySequence_Fast_GET_ITEM(seq, i);
        memcpy(r->marks[i], PyBytes_AS_STRING(m), (size_t)PyBytes_GET_SIZE(m));
        r->lens[i] = (size_t)PyBytes_GET_SIZE(m);
    }
    r->n = (int)n;
    Py_DECREF(seq);
    return 0;
}

static inline int hm_reserved_plainly_valid(const HmReserved *r, const unsigned char *p, Py_ssize_t n)
{
    return hm_properties_plainly_valid(r->marks, r->lens, r->n, p, n);
}


#endif
