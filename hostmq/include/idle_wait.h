/* hostmq/include/idle_wait.h: what every native wait shares — the clock, the idle strategies' phase
 * before a futex sleep (hostmq/waiting.py IdleStrategy.idle: spin, yield, backoff, sleep, with a
 * budget), and futex sleeps and wake-ups on the futex half of an aligned int64 word (as
 * hostmq/shm/futex.py FutexWord: the low 32 bits; shared futexes, the words are in shared memory).
 *
 * Included by hostmq/ingress/_step.c (the writer's loop, the producer's wait) and hostmq/shm/_futex.c
 * (a consumer's wait on its wake words). Header-only: static functions, no state. */
#ifndef HOSTMQ_IDLE_WAIT_H
#define HOSTMQ_IDLE_WAIT_H

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* waiting.IDLE_CODES: the order of waiting.IDLE_KINDS */
enum { HM_IDLE_SPIN = 0, HM_IDLE_YIELD = 1, HM_IDLE_BACKOFF = 2, HM_IDLE_SLEEP = 3 };
#define HM_BACKOFF_SPIN_NS 10000LL        /* waiting.BACKOFF_SPIN_US */

static inline long long hm_mono_ns(void)            /* time.monotonic() in ns */
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static inline void hm_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

typedef int (*hm_ready_fn)(const void *ctx);

/* The strategy's phase before the futex: ``ready(ctx)`` re-checked for ``budget_ns`` (bounded by
 * ``deadline_ns``) — busy for spin, yielding the core for yield, busy for HM_BACKOFF_SPIN_NS then
 * yielding for backoff, not at all for sleep. 1 as soon as it holds, 0 when the budget is spent. */
static int hm_idle_phase(hm_ready_fn ready, const void *ctx, int kind, long long budget_ns, long long deadline_ns)
{
    if (kind == HM_IDLE_SLEEP || budget_ns <= 0)
        return 0;
    long long now = hm_mono_ns();
    long long end = now + budget_ns < deadline_ns ? now + budget_ns : deadline_ns;
    long long busy_end = kind == HM_IDLE_SPIN ? end
                       : kind == HM_IDLE_BACKOFF ? (now + HM_BACKOFF_SPIN_NS < end ? now + HM_BACKOFF_SPIN_NS : end)
                       : now;
    while (now < busy_end) {
        if (ready(ctx))
            return 1;
        hm_cpu_relax();
        now = hm_mono_ns();
    }
    while (now < end) {
        if (ready(ctx))
            return 1;
        sched_yield();
        now = hm_mono_ns();
    }
    return 0;
}

static inline uint32_t *hm_futex_half(int64_t *word)  /* the half that changes first */
{
    uint32_t *half = (uint32_t *)word;
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    half += 1;
#endif
    return half;
}

static inline uint32_t hm_futex_arm(int64_t *word)     /* FutexWord.arm */
{
    return __atomic_load_n(hm_futex_half(word), __ATOMIC_ACQUIRE);
}

/* FUTEX_WAIT while the word holds ``token``, until ``deadline_ns`` (CLOCK_MONOTONIC): 0 woken (or the
 * word had moved), ETIMEDOUT, or EINTR. */
static inline int hm_futex_sleep(int64_t *word, uint32_t token, long long deadline_ns)
{
    long long left = deadline_ns - hm_mono_ns();
    if (left <= 0)
        return ETIMEDOUT;
    struct timespec ts = {(time_t)(left / 1000000000LL), (long)(left % 1000000000LL)};
    if (syscall(SYS_futex, hm_futex_half(word), FUTEX_WAIT, token, &ts, NULL, 0) == 0)
        return 0;
    return errno == EAGAIN ? 0 : errno;
}

static inline void hm_futex_wake(int64_t *word)          /* FutexWord.wake: every sleeper */
{
    syscall(SYS_futex, hm_futex_half(word), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

#endif
