/* hostmq/include/crc32_fast.h: zlib's CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320: the value
 * zlib.crc32 gives). From 64 bytes on x86-64 CPUs with PCLMULQDQ (checked at run time): folded 64 and
 * 16 bytes at a time with carry-less multiplies, then reduced (Intel's "Fast CRC Computation for
 * Generic Polynomials Using PCLMULQDQ", the constants of Linux's crc32-pclmul and Chromium's zlib),
 * the last 0-15 bytes by table. Elsewhere, eight bytes at a time ("slicing-by-8") for the short bodies
 * every message's record carries — 100 bytes in ~65 ns against zlib 1.2.13's ~155 on the dev VM,
 * whose per-call cost dominates there — and zlib from HM_CRC_ZLIB_FROM bytes. The tables and the CPU
 * check are set up by hm_crc32_init() in each module's exec, before any call. Include after zlib.h.
 * tests/test_crc32.py compares it with zlib.crc32 on every length up to past both switches, at every
 * alignment, and on random data. */
#ifndef HOSTMQ_CRC32_FAST_H
#define HOSTMQ_CRC32_FAST_H

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "hostmq/include/crc32_fast.h reads words little-endian"
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t hm_crc_table[8][256];

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HM_CRC_PCLMUL 1
static int hm_crc_pclmul;           /* the CPU has PCLMULQDQ and SSE4.1 (hm_crc32_init) */

/* The CRC register after ``len`` bytes (len >= 64, a multiple of 16) from register ``crc`` (the
 * pre-inverted form: ~0 for a fresh CRC; the result is inverted the same way). */
__attribute__((target("pclmul,sse4.1")))
static uint32_t hm_crc32_fold(const unsigned char *buf, size_t len, uint32_t crc)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8;
    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    while (len >= 64) {                                 /* four lanes of 16 bytes, folded 64 ahead */
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(buf + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(buf + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(buf + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(buf + 0x30)));
        buf += 64;
        len -= 64;
    }
    x0 = k3k4;                                          /* the four lanes into one */
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, x0, 0x11), x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, x0, 0x11), x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, x0, 0x11), x4), x5);
    while (len >= 16) {                                 /* the remaining blocks of 16 */
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, x0, 0x11),
                                         _mm_loadu_si128((const __m128i *)buf)), x5);
        buf += 16;
        len -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);            /* 128 bits to 64 */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), x0, 0x00), x2);
    x0 = poly;                                          /* Barrett reduction to 32 bits */
    x2 = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), x0, 0x10), mask32);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static void hm_crc32_init(void)
{
#ifdef HM_CRC_PCLMUL
    __builtin_cpu_init();
    hm_crc_pclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
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

/* zlib.crc32(p[:n]): folded with PCLMULQDQ from 64 bytes where the CPU has it; else slicing-by-8
 * below HM_CRC_ZLIB_FROM bytes, zlib from there. */
static inline uint32_t hm_crc32_any(const unsigned char *p, size_t n)
{
#ifdef HM_CRC_PCLMUL
    if (n >= 64 && hm_crc_pclmul) {
        size_t folded = n & ~(size_t)15;
        uint32_t crc = ~hm_crc32_fold(p, folded, ~0u);
        return folded == n ? crc : hm_crc32(crc, p + folded, n - folded);
    }
#endif
    return n < HM_CRC_ZLIB_FROM ? hm_crc32(0, p, n) : (uint32_t)crc32(0L, p, (uInt)n);
}

/* A record's BODYCRC: crc32 & 0x7FFFFFFF (records.py body_crc). */
static inline uint32_t hm_body_crc(const unsigned char *p, size_t n)
{
    return hm_crc32_any(p, n) & 0x7FFFFFFFu;
}

#endif
