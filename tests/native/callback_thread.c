/*
 * Calls a Python ctypes callback from native pthreads, the way librocketmq (the C++ core of
 * rocketmq-client-python) calls a consumer's listener: each call arrives on a thread Python
 * did not create, so ctypes gives it a fresh Python thread state (PyGILState_Ensure) that is
 * destroyed when the callback returns.
 *
 * Built by tests/native/__init__.py into a temporary directory; never committed.
 */
#include <pthread.h>
#include <stdlib.h>

/* The callback gets a global index (thread * calls_per_thread + call) and returns a status:
 * 0 = CONSUME_SUCCESS, 1 = RECONSUME_LATER (ConsumeStatus). */
typedef int (*callback_fn)(int index);

struct worker {
    callback_fn cb;
    int first;         /* global index of this thread's first call */
    int calls;         /* calls this thread makes */
    int *statuses;     /* statuses[first .. first + calls): each call's return value */
};

static void *worker_main(void *arg) {
    struct worker *w = (struct worker *)arg;
    for (int i = 0; i < w->calls; i++) {
        w->statuses[w->first + i] = w->cb(w->first + i);
    }
    return NULL;
}

/*
 * Start `threads` pthreads; each calls cb(index) `calls_per_thread` times in order; join them.
 * `statuses` (threads * calls_per_thread ints) receives every return value by index.
 * Returns how many calls returned 0 (CONSUME_SUCCESS); -1 for invalid arguments or when a
 * thread could not be started (the threads already started are joined first).
 */
int run_callbacks(callback_fn cb, int threads, int calls_per_thread, int *statuses) {
    if (cb == NULL || statuses == NULL || threads < 1 || calls_per_thread < 0) {
        return -1;
    }
    pthread_t *ids = calloc((size_t)threads, sizeof(pthread_t));
    struct worker *workers = calloc((size_t)threads, sizeof(struct worker));
    if (ids == NULL || workers == NULL) {
        free(ids);
        free(workers);
        return -1;
    }
    int started = 0;
    for (; started < threads; started++) {
        workers[started].cb = cb;
        workers[started].first = started * calls_per_thread;
        workers[started].calls = calls_per_thread;
        workers[started].statuses = statuses;
        if (pthread_create(&ids[started], NULL, worker_main, &workers[started]) != 0) {
            break;
        }
    }
    for (int t = 0; t < started; t++) {
        pthread_join(ids[t], NULL);
    }
    free(ids);
    free(workers);
    if (started < threads) {
        return -1;
    }
    int successes = 0;
    for (int i = 0; i < threads * calls_per_thread; i++) {
        if (statuses[i] == 0) {
            successes++;
        }
    }
    return successes;
}
