/* hostmq/shm/_futex.c: a wait on futex words in C — hostmq/shm/signal.py wait_changed's native path.
 *
 * wait_changed(seqs, deadline_ns, idle_kind, idle_ns): until one of ``seqs`` — (FutexWord, token)
 * pairs of hostmq/shm/futex.py, the tokens their ``arm()`` returned — no longer holds its token, the
 * deadline (CLOCK_MONOTONIC ns) passes, or a signal interrupts the sleep: the idle strategy's phase,
 * then one futex sleep on every word at once (futex_waitv, Linux >= 5.16; on older kernels the first
 * word in 2 ms slices, as futex.sleep_any does), with the GIL released. What signal.wait_for does with
 * the predicate "a word moved" (a consumer's wait on its queues' wake words), without the Python
 * between its steps. The words are read through buffers held for the whole call (a mapping cannot go
 * away under it); a read-only mapping is enough (futexes only read). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../include/idle_wait.h"

#define MAX_WORDS 128              /* futex.MAX_WAITV: the kernel's FUTEX_WAITV_MAX */
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
#ifndef FUTEX_32
#define FUTEX_32 2                 /* FUTEX2_SIZE_U32 */
#endif

enum { W_TIMED_OUT = 0, W_AT_ONCE = 1, W_IDLE_HIT = 2, W_WOKEN = 3, W_DEADLINE_IDLE = 4, W_SIGNAL = -1 };

struct hm_waitv {                  /* struct futex_waitv */
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};

typedef struct {
    int64_t *word[MAX_WORDS];
    uint32_t token[MAX_WORDS];
    Py_ssize_t n;
} Words;

static int moved(const void *ctx)
{
    const Words *w = ctx;
    for (Py_ssize_t i = 0; i < w->n; i++)
        if (hm_futex_arm(w->word[i]) != w->token[i])
            return 1;
    return 0;
}

static int waitv_ok = 1;           /* cleared once the kernel says ENOSYS */

/* One sleep on every word until one moves or the deadline: 0 woken, ETIMEDOUT, EINTR. */
static int sleep_words(const Words *w, long long deadline_ns)
{
    if (w->n == 1)
        return hm_futex_sleep(w->word[0], w->token[0], deadline_ns);
    if (waitv_ok) {
        struct hm_waitv v[MAX_WORDS];
        for (Py_ssize_t i = 0; i < w->n; i++) {
            v[i].val = w->token[i];
            v[i].uaddr = (uint64_t)(uintptr_t)hm_futex_half(w->word[i]);
            v[i].flags = FUTEX_32;
            v[i].reserved = 0;
        }
        struct timespec ts = {(time_t)(deadline_ns / 1000000000LL), (long)(deadline_ns % 1000000000LL)};
        if (syscall(SYS_futex_waitv, v, (unsigned)w->n, 0, &ts, CLOCK_MONOTONIC) >= 0)
            return 0;
        if (errno != ENOSYS)
            return errno == EAGAIN ? 0 : errno;
        waitv_ok = 0;
    }
    long long slice = hm_mono_ns() + 2000000LL;
    return hm_futex_sleep(w->word[0], w->token[0], slice < deadline_ns ? slice : deadline_ns) == EINTR ? EINTR : 0;
}

PyDoc_STRVAR(wait_changed_doc,
"wait_changed(seqs, deadline_ns, idle_kind, idle_ns) -> int\n\n"
"Until a word of ``seqs`` ((FutexWord, token) pairs) no longer holds its token: 1 at once, 2 during\n"
"the idle strategy's phase, 3 after a futex sleep; 0 the deadline passed while asleep, 4 before it\n"
"slept; -1 a signal interrupted the sleep (see hostmq/shm/signal.py wait_changed).");

static PyObject *wait_changed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "wait_changed() takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *seqs = PySequence_Fast(args[0], "wait_changed(): seqs must be a sequence of (FutexWord, token)");
    if (seqs == NULL)
        return NULL;
    long long v[3];
    for (int i = 0; i < 3; i++) {
        v[i] = PyLong_AsLongLong(args[1 + i]);
        if (v[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seqs);
            return NULL;
        }
    }
    long long deadline = v[0], kind = v[1], budget = v[2];
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seqs);
    if (n < 1 || n > MAX_WORDS || kind < 0 || kind > HM_IDLE_SLEEP) {
        Py_DECREF(seqs);
        PyErr_SetString(PyExc_ValueError, "wait_changed(): 1 to 128 words and an idle code of 0..3");
        return NULL;
    }
    Py_buffer bufs[MAX_WORDS];
    Words w;
    w.n = 0;
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seqs, i);
        PyObject *fw, *arr = NULL, *idx = NULL;
        long long index, token;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_ValueError, "wait_changed(): each item is a (FutexWord, token) pair");
            goto done;
        }
        fw = PyTuple_GET_ITEM(pair, 0);
        token = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
        if (token == -1 && PyErr_Occurred())
            goto done;
        arr = PyObject_GetAttrString(fw, "_arr");
        idx = arr != NULL ? PyObject_GetAttrString(fw, "_index") : NULL;
        index = idx != NULL ? PyLong_AsLongLong(idx) : -1;
        int got = idx != NULL && !(index == -1 && PyErr_Occurred())
                  && PyObject_GetBuffer(arr, &bufs[i], PyBUF_C_CONTIGUOUS) == 0;
        Py_XDECREF(arr);
        Py_XDECREF(idx);
        if (!got) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "wait_changed(): not a FutexWord");
            goto done;
        }
        w.n = i + 1;
        if (index < 0 || (index + 1) * 8 > bufs[i].len || ((uintptr_t)bufs[i].buf & 7) || token < 0
            || token > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "wait_changed(): a word outside its words, or a token not of 32 bits");
            goto done;
        }
        w.word[i] = (int64_t *)bufs[i].buf + index;
        w.token[i] = (uint32_t)token;
    }
    int r = W_TIMED_OUT;
    Py_BEGIN_ALLOW_THREADS
    if (moved(&w)) {
        r = W_AT_ONCE;
    } else if (hm_idle_phase(moved, &w, (int)kind, budget, deadline)) {
        r = W_IDLE_HIT;
    } else if (hm_mono_ns() >= deadline) {
        r = W_DEADLINE_IDLE;
    } else {
        for (;;) {
            int e = sleep_words(&w, deadline);
            if (moved(&w)) {
                r = W_WOKEN;
                break;
            }
            if (e == EINTR) {
                r = W_SIGNAL;
                break;
            }
            if (hm_mono_ns() >= deadline) {
                r = W_TIMED_OUT;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    out = PyLong_FromLong(r);
done:
    for (Py_ssize_t i = 0; i < w.n; i++)
        PyBuffer_Release(&bufs[i]);
    Py_DECREF(seqs);
    return out;
}

static PyMethodDef methods[] = {
    {"wait_changed", (PyCFunction)(void (*)(void))wait_changed, METH_FASTCALL, wait_changed_doc},
    {NULL, NULL, 0, NULL},
};

static int futex_exec(PyObject *m)
{
    return PyModule_AddIntConstant(m, "IDLE_SPIN", HM_IDLE_SPIN) || PyModule_AddIntConstant(m, "IDLE_YIELD", HM_IDLE_YIELD)
        || PyModule_AddIntConstant(m, "IDLE_BACKOFF", HM_IDLE_BACKOFF)
        || PyModule_AddIntConstant(m, "IDLE_SLEEP", HM_IDLE_SLEEP) ? -1 : 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, futex_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hostmq.shm._futex",
    "Waits on futex words in C (hostmq/shm/signal.py wait_changed is its spec).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__futex(void) { return PyModuleDef_Init(&module); }
