/* hostmq/bench/relay_floor.c — the floor under hostmq's delivery latency, in C (issue 29).
 *
 * What one message costs when nothing but the hand-offs is left: no Python, no store, no checks
 * beyond a CRC. Processes (fork) share one anonymous MAP_SHARED page set; each hop is a slot ring
 * with a 32-bit sequence word that is also the futex word, and a "waiting" word the reader sets
 * before it sleeps — the protocol of hostmq.shm (notify_if_waiting / wait_for): the writer of a hop
 * stores the message, publishes the sequence (release), and makes the futex wake call only when the
 * reader says it waits.
 *
 *   direct   producer → consumer                     (one hop: the raw ring, in C)
 *   relay    producer → writer → consumer            (two hops: hostmq's shape — the writer copies
 *                                                      the 100-byte message, CRCs it, republishes it)
 *   direct_split, relay_split                        (the same, placed: the producer — and the writer —
 *                                                      pinned to one CPU, the consumer to another, the
 *                                                      first two the process may use; so the last
 *                                                      hop always crosses CPUs, as the kernel places
 *                                                      hostmq's consumer on most runs of 2 vCPUs)
 *   echo     producer → writer → producer            (an acknowledged send: the producer writes a
 *                                                      batch of BATCH messages, the writer copies each
 *                                                      out, CRCs it and appends it to a log, then
 *                                                      answers; the producer sends the next batch as
 *                                                      soon as the answer comes — send / send_batch)
 *
 * The producer stamps CLOCK_MONOTONIC into the message and sends one every PERIOD_US (absolute
 * deadlines, clock_nanosleep); the consumer takes now − stamp. Readers spin SPIN_US µs (0: none,
 * hostmq's "sleep" strategy) before they sleep on the futex.
 *
 *   relay_floor direct|relay|direct_split|relay_split MESSAGES WARMUP PERIOD_US SPIN_US [LATENCIES_FILE]
 *   relay_floor echo|echo_split ROUND_TRIPS WARMUP BATCH SPIN_US [LATENCIES_FILE]
 *                                                    (echo_split: the producer pinned to one CPU, the
 *                                                     writer to another — each hand-off crosses CPUs)
 *
 * prints one line: "MODE measured p50 p90 p99 p99.9 max" (ns; echo: round trips) and, given
 * LATENCIES_FILE, writes every measured latency there (native uint64 ns, in arrival order); exits 2
 * on bad arguments, 3 when a split mode finds fewer than two CPUs it may use, and 1 on a system
 * error. Its children die with it (PR_SET_PDEATHSIG). Built and run by hostmq/bench/floor.py with
 * the system compiler (cc -O2, zlib's crc32 as hostmq's writer). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define SLOTS 64
#define MSG_BYTES 100
#define MAX_BATCH 1000
#define LOG_BYTES (4u << 20)

typedef struct {
    _Alignas(64) _Atomic uint32_t seq;      /* messages published (the futex word) */
    _Alignas(64) _Atomic uint32_t waiting;  /* the reader sleeps (or is about to) */
    _Alignas(64) unsigned char slot[SLOTS][128];
} Hop;

typedef struct {
    Hop a, b;                               /* producer → (writer →) consumer */
    _Atomic uint32_t ready;                 /* readers up */
    uint32_t crc_sink;
    unsigned char batch[MAX_BATCH * MSG_BYTES];     /* echo: the producer's frame */
    unsigned char log[LOG_BYTES];                   /* echo: where the writer appends (wraps) */
} Shared;

static long futex(_Atomic uint32_t *w, int op, uint32_t v)
{
    return syscall(SYS_futex, (uint32_t *)w, op, v, NULL, NULL, 0);
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void publish(Hop *h, uint32_t seq)
{
    atomic_store_explicit(&h->seq, seq, memory_order_release);
    if (atomic_load_explicit(&h->waiting, memory_order_seq_cst))
        futex(&h->seq, FUTEX_WAKE, 1);
}

/* Wait until h->seq != seen: spin spin_ns, then arm "waiting", re-check, sleep. */
static uint32_t await_next(Hop *h, uint32_t seen, uint64_t spin_ns)
{
    uint32_t s = atomic_load_explicit(&h->seq, memory_order_acquire);
    if (s != seen)
        return s;
    if (spin_ns) {
        uint64_t until = now_ns() + spin_ns;
        do {
            __builtin_ia32_pause();
            s = atomic_load_explicit(&h->seq, memory_order_acquire);
            if (s != seen)
                return s;
        } while (now_ns() < until);
    }
    for (;;) {
        atomic_store_explicit(&h->waiting, 1, memory_order_seq_cst);
        s = atomic_load_explicit(&h->seq, memory_order_acquire);
        if (s != seen) {
            atomic_store_explicit(&h->waiting, 0, memory_order_relaxed);
            return s;
        }
        futex(&h->seq, FUTEX_WAIT, seen);
        atomic_store_explicit(&h->waiting, 0, memory_order_relaxed);
        s = atomic_load_explicit(&h->seq, memory_order_acquire);
        if (s != seen)
            return s;
    }
}

/* The split modes' placement: pin the calling process to the `which`-th CPU (0 or 1) of the set the
 * program started with. 0 done, -1 fewer than which + 1 CPUs in the set, or the call failed. */
static int pin_to(const cpu_set_t *allowed, int which)
{
    for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, allowed))
            continue;
        if (seen++ == which) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            return sched_setaffinity(0, sizeof one, &one);
        }
    }
    return -1;
}

static uint32_t crc32_of(const unsigned char *p, size_t n)
{
    return (uint32_t)crc32(0L, p, (uInt)n) & 0x7FFFFFFFu;
}

static void writer(Shared *sh, uint32_t total, uint64_t spin_ns)
{
    uint32_t seen = 0;
    unsigned char copy[MSG_BYTES];
    while (seen < total) {
        uint32_t upto = await_next(&sh->a, seen, spin_ns);
        for (uint32_t s = seen; s != upto; s++) {        /* copy out, check, republish: the writer's step */
            memcpy(copy, sh->a.slot[s % SLOTS], MSG_BYTES);
            sh->crc_sink ^= crc32_of(copy, MSG_BYTES);
            memcpy(sh->b.slot[s % SLOTS], copy, MSG_BYTES);
        }
        seen = upto;
        publish(&sh->b, seen);
    }
}

/* echo: copy each message of a frame out, check it, append it; then answer. */
static void echo_writer(Shared *sh, uint32_t total, uint32_t batch, uint64_t spin_ns)
{
    uint32_t seen = 0;
    size_t at = 0;
    unsigned char copy[MSG_BYTES];
    while (seen < total) {
        uint32_t upto = await_next(&sh->a, seen, spin_ns);
        for (uint32_t s = seen; s != upto; s++)
            for (uint32_t i = 0; i < batch; i++) {
                memcpy(copy, sh->batch + (size_t)i * MSG_BYTES, MSG_BYTES);
                sh->crc_sink ^= crc32_of(copy, MSG_BYTES);
                if (at + MSG_BYTES > LOG_BYTES)
                    at = 0;
                memcpy(sh->log + at, copy, MSG_BYTES);
                at += MSG_BYTES;
            }
        seen = upto;
        publish(&sh->b, seen);
    }
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* Write the latencies (if asked), print the summary line, free them. */
static int report(uint64_t *lat, uint32_t n, const char *mode, const char *out_path)
{
    if (out_path != NULL) {
        FILE *f = fopen(out_path, "wb");
        if (f == NULL || fwrite(lat, sizeof *lat, n, f) != n || fclose(f) != 0) {
            perror(out_path);
            free(lat);
            return 1;
        }
    }
    qsort(lat, n, sizeof *lat, cmp_u64);
#define Q(p) (n ? lat[(size_t)((p) * (n - 1) + 0.5)] : 0)
    printf("%s %u %llu %llu %llu %llu %llu\n", mode, n, (unsigned long long)Q(0.5), (unsigned long long)Q(0.9),
           (unsigned long long)Q(0.99), (unsigned long long)Q(0.999), (unsigned long long)(n ? lat[n - 1] : 0));
    fflush(stdout);
    free(lat);
    return 0;
}

static int consumer(Shared *sh, Hop *h, uint32_t total, uint32_t warmup, uint64_t spin_ns, const char *mode,
                    const char *out_path)
{
    uint64_t *lat = calloc(total, sizeof *lat);
    if (lat == NULL)
        return 1;
    uint32_t seen = 0, n = 0;
    atomic_fetch_add(&sh->ready, 1);
    while (seen < total) {
        uint32_t upto = await_next(h, seen, spin_ns);
        uint64_t t = now_ns();
        for (uint32_t s = seen; s != upto; s++) {
            uint64_t stamp;
            memcpy(&stamp, h->slot[s % SLOTS], sizeof stamp);
            if (s >= warmup)
                lat[n++] = t - stamp;
        }
        seen = upto;
    }
    return report(lat, n, mode, out_path);
}

/* Until `readers` children are up: 0, or -1 when one of them ended first (it could not start). */
static int await_readers(Shared *sh, uint32_t readers)
{
    while (atomic_load(&sh->ready) < readers) {
        if (waitpid(-1, NULL, WNOHANG) > 0)
            return -1;
        usleep(1000);
    }
    return 0;
}

/* echo's producer: a frame of `batch` stamped messages, publish, wait for the answer; round trips. */
static int echo_producer(Shared *sh, uint32_t total, uint32_t warmup, uint32_t batch, uint64_t spin_ns,
                         const char *out_path)
{
    uint64_t *lat = calloc(total, sizeof *lat);
    if (lat == NULL)
        return 1;
    if (await_readers(sh, 1) != 0) {
        free(lat);
        return 1;
    }
    unsigned char msg[MSG_BYTES];
    memset(msg, 'x', sizeof msg);
    uint32_t n = 0;
    for (uint32_t s = 0; s < total; s++) {
        uint64_t t0 = now_ns();
        for (uint32_t i = 0; i < batch; i++) {
            memcpy(msg, &t0, sizeof t0);
            memcpy(sh->batch + (size_t)i * MSG_BYTES, msg, MSG_BYTES);
        }
        publish(&sh->a, s + 1);
        await_next(&sh->b, s, spin_ns);
        if (s >= warmup)
            lat[n++] = now_ns() - t0;
    }
    return report(lat, n, "echo", out_path);
}

static int producer(Shared *sh, uint32_t total, uint64_t period_ns, uint32_t readers)
{
    if (await_readers(sh, readers) != 0)
        return 1;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    unsigned char msg[MSG_BYTES];
    memset(msg, 'x', sizeof msg);
    for (uint32_t s = 0; s < total; s++) {
        uint64_t ns = (uint64_t)next.tv_nsec + period_ns;
        next.tv_sec += (time_t)(ns / 1000000000u);
        next.tv_nsec = (long)(ns % 1000000000u);
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
            ;
        uint64_t stamp = now_ns();
        memcpy(msg, &stamp, sizeof stamp);
        memcpy(sh->a.slot[s % SLOTS], msg, MSG_BYTES);
        publish(&sh->a, s + 1);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: %s direct|relay|direct_split|relay_split MESSAGES WARMUP PERIOD_US SPIN_US "
                        "[LATENCIES_FILE]\n"
                        "       %s echo|echo_split ROUND_TRIPS WARMUP BATCH SPIN_US [LATENCIES_FILE]\n", argv[0],
                argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    int split = strcmp(mode, "direct_split") == 0 || strcmp(mode, "relay_split") == 0
                || strcmp(mode, "echo_split") == 0;
    int relay = strcmp(mode, "relay") == 0 || strcmp(mode, "relay_split") == 0;
    int echo = strcmp(mode, "echo") == 0 || strcmp(mode, "echo_split") == 0;
    long messages = atol(argv[2]), warmup = atol(argv[3]), period_us = atol(argv[4]), spin_us = atol(argv[5]);
    if ((!relay && !echo && !split && strcmp(mode, "direct") != 0) || messages < 1 || messages > 10000000
        || warmup < 0 || warmup > 1000000 || period_us < 1 || period_us > (echo ? MAX_BATCH : 1000000)
        || spin_us < 0 || spin_us > 1000000) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    cpu_set_t allowed;
    if (split && (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2)) {
        fprintf(stderr, "%s needs two CPUs this process may use\n", mode);
        return 3;
    }
    uint32_t total = (uint32_t)(messages + warmup);
    uint64_t spin_ns = (uint64_t)spin_us * 1000u;
    Shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(sh, 0, sizeof *sh);
    if (echo) {
        pid_t w = fork();
        if (w < 0) {
            perror("fork");
            return 1;
        }
        if (w == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (split && pin_to(&allowed, 1) != 0)
                _exit(1);
            atomic_fetch_add(&sh->ready, 1);
            echo_writer(sh, total, (uint32_t)period_us, spin_ns);
            _exit(0);
        }
        if (split && pin_to(&allowed, 0) != 0) {
            perror("sched_setaffinity");
            kill(w, SIGKILL);
            return 1;
        }
        int bad = echo_producer(sh, total, (uint32_t)warmup, (uint32_t)period_us, spin_ns, argc == 7 ? argv[6] : NULL);
        int status;
        return bad || waitpid(w, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status);
    }
    pid_t kids[2] = {0, 0};
    kids[0] = fork();
    if (kids[0] == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (split && pin_to(&allowed, 1) != 0) {
            perror("sched_setaffinity");
            _exit(1);                   /* the parent sees it exit and stops (below) */
        }
        _exit(consumer(sh, relay ? &sh->b : &sh->a, total, (uint32_t)warmup, spin_ns, mode,
                       argc == 7 ? argv[6] : NULL));
    }
    if (relay && kids[0] > 0) {
        kids[1] = fork();
        if (kids[1] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (split && pin_to(&allowed, 0) != 0)
                _exit(1);
            atomic_fetch_add(&sh->ready, 1);
            writer(sh, total, spin_ns);
            _exit(0);
        }
    }
    if (kids[0] < 0 || kids[1] < 0) {
        perror("fork");
        for (int i = 0; i < 2; i++)
            if (kids[i] > 0)
                kill(kids[i], SIGKILL);
        return 1;
    }
    int bad = split && pin_to(&allowed, 0) != 0;
    if (bad)
        perror("sched_setaffinity");
    else
        bad = producer(sh, total, (uint64_t)period_us * 1000u, relay ? 2 : 1);
    if (bad)                            /* the children do not outlive a producer that stopped */
        for (int i = 0; i < 2; i++)
            if (kids[i] > 0)
                kill(kids[i], SIGKILL);
    for (int i = 0; i < 2; i++) {
        int status;
        if (kids[i] > 0 && (waitpid(kids[i], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)))
            bad = 1;
    }
    return bad;
}
