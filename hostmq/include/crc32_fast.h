/* hostmq/include/crc32_fast.h: zlib's CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320: the value
 * zlib.crc32 gives) eight bytes at a time ("slicing-by-8"), for the short bodies every message's
 * record carries: 100 bytes in ~65 ns against zlib 1.2.13's ~155 on the dev VM, whose per-call cost
 * dominates there; from HM_CRC_ZLIB_FROM bytes zlib is as fast or faster and is used. The tables are
 * built by hm_crc32_init() in each module's exec, before any call. Include after zlib.h.
 * tests/test_crc32.py compares it with zlib.crc32 on every length up to past the switch, at every
 * alignment. */
#ifndef HOSTMQ_CRC32_FAST_H
#define HOSTMQ_CRC32_FAST_H

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "hostmq/include/crc32_fast.h reads words little-endian"
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t hm_crc_table[8][256];

static void hm_crc32_init(void)
{
    if (hm_crc_table[0][1] != 0)
        return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        hm_crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            hm_crc_table[t][i] = (hm_crc_table[t - 1][i] >> 8) ^ hm_crc_table[0][hm_crc_table[t - 1][i] & 0xFF];
}

/* zlib's crc32(crc, p, n), on a little-endian machine (the build refuses others). */
static inline uint32_t hm_crc32(uint32_t crc, const unsigned char *p, size_t n)
{
    const uint32_t (*T)[256] = (const uint32_t (*)[256])hm_crc_table;
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = T[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^ T[4][lo >> 24] ^
              T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^ T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = T[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#define HM_CRC_ZLIB_FROM 512

/* zlib.crc32(p[:n]): slicing-by-8 below HM_CRC_ZLIB_FROM bytes, zlib from there. */
static inline uint32_t hm_crc32_any(const unsigned char *p, size_t n)
{
    return n < HM_CRC_ZLIB_FROM ? hm_crc32(0, p, n) : (uint32_t)crc32(0L, p, (uInt)n);
}

/* A record's BODYCRC: crc32 & 0x7FFFFFFF (records.py body_crc). */
static inline uint32_t hm_body_crc(const unsigned char *p, size_t n)
{
    return hm_crc32_any(p, n) & 0x7FFFFFFFu;
}

#endif
