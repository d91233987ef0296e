/* Worker threads for a loop object's queue of files (the pack's reader, packloop.c; the
 * unpack's writers, unpackloop.c), and the private descriptor table every thread of ours
 * that opens files takes (hashtree.c too).
 *
 * Included by dsnative.c before the loops (one translation unit). A pool is started by a
 * loop object the first time it has a queue to share (threads - 1 workers: the calling
 * thread works too), runs one queue at a time (pool_run returns once every item is done),
 * and is stopped by the object's close() (which its Python caller calls in a finally, an
 * error included) or its end, so no worker outlives the call that made it (a process that
 * forks later forks no thread). Each worker takes the next
 * POOL_CHUNK items not taken.
 *
 * Each worker first gives itself a table of file descriptors of its own, holding only the
 * standard streams and the loop's directory (own_fd_table): the threads of one process otherwise open and close
 * every file through the one shared table and contend for its lock on many cores (on a
 * 16-core node, 16 threads hashed 50,000 files of 4 KB in 52 ms sharing it, 18 ms each
 * with its own). Where close_range(CLOSE_RANGE_UNSHARE) is refused (Linux before 5.9, a
 * seccomp profile without it), the worker shares the process's table, slower and
 * otherwise the same. A worker holds no copy of another thread's descriptors: a socket or
 * pipe the process closes elsewhere closes at once.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#define POOL_THREADS_MAX 64
#define POOL_CHUNK 8
#define UNSHARE_FDS (1U << 1) /* CLOSE_RANGE_UNSHARE, <linux/close_range.h>, not on every build host */

/* Name the calling thread (at most 15 characters), as `top -H` and /proc/<pid>/task/<tid>/comm
 * show it: every thread of ours is a "dsnative-..." one. */
static void name_thread(const char *name) {
#ifdef __linux__
    (void)prctl(PR_SET_NAME, name, 0, 0, 0);
#else
    (void)name;
#endif
}

/* This thread's own table of descriptors, holding only the standard streams (0-2: where a
 * report from this thread goes, a sanitizer's or an I/O hook's, and never a file of ours)
 * and `keep` (none when it is < 0). */
static void own_fd_table(int keep) {
#ifdef SYS_close_range
    if (keep > 3) {
        if (syscall(SYS_close_range, 3U, (unsigned)keep - 1, UNSHARE_FDS) == 0)
            (void)syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0U);
    } else { /* keep is one of 0-3, or none: everything above it and the streams goes */
        (void)syscall(SYS_close_range, keep == 3 ? 4U : 3U, ~0U, UNSHARE_FDS);
    }
#else
    (void)keep;
#endif
}

typedef void (*pool_work)(void *ctx, Py_ssize_t item);

typedef struct work_pool {
    pthread_mutex_t lock;
    pthread_cond_t go, done;
    pthread_t ids[POOL_THREADS_MAX];
    int started;
    int keep_fd;
    unsigned long round; /* raised for each queue */
    int busy;            /* workers not done with this round */
    int stop;
    pool_work work;
    void *ctx;
    Py_ssize_t count;
    _Atomic Py_ssize_t taken; /* the first item not taken */
} work_pool;

static void pool_take(work_pool *pool) {
    for (;;) {
        Py_ssize_t i = atomic_fetch_add(&pool->taken, POOL_CHUNK);
        if (i >= pool->count) return;
        Py_ssize_t end = i + POOL_CHUNK < pool->count ? i + POOL_CHUNK : pool->count;
        for (; i < end; i++) pool->work(pool->ctx, i);
    }
}

static void *pool_thread(void *arg) {
    work_pool *pool = arg;
    name_thread("dsnative-pool");
    own_fd_table(pool->keep_fd);
    unsigned long seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->stop && pool->round == seen) pthread_cond_wait(&pool->go, &pool->lock);
        if (pool->stop) break;
        seen = pool->round;
        pthread_mutex_unlock(&pool->lock);
        pool_take(pool);
        pthread_mutex_lock(&pool->lock);
        if (--pool->busy == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

/* threads - 1 workers whose tables keep `keep_fd` (fewer if some cannot start); NULL
 * without memory (then pool_run works on the calling thread alone). */
static work_pool *pool_start(int threads, int keep_fd) {
    work_pool *pool = calloc(1, sizeof *pool);
    if (pool == NULL) return NULL;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->go, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->keep_fd = keep_fd;
    int want = threads - 1 < POOL_THREADS_MAX ? threads - 1 : POOL_THREADS_MAX;
    while (pool->started < want && pthread_create(&pool->ids[pool->started], NULL, pool_thread, pool) == 0)
        pool->started++;
    return pool;
}

/* work(ctx, i) for every i < count, on the workers and this thread; returns when all are done. */
static void pool_run(work_pool *pool, pool_work work, void *ctx, Py_ssize_t count) {
    if (pool == NULL || pool->started == 0) {
        for (Py_ssize_t i = 0; i < count; i++) work(ctx, i);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->work = work;
    pool->ctx = ctx;
    pool->count = count;
    atomic_store(&pool->taken, 0);
    pool->busy = pool->started;
    pool->round++;
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->lock);
    pool_take(pool);
    pthread_mutex_lock(&pool->lock);
    while (pool->busy > 0) pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}

/* The workers ended and joined (idle ones end at once), the pool freed. */
static void pool_stop(work_pool *pool) {
    if (pool == NULL) return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->lock);
    for (int k = 0; k < pool->started; k++) pthread_join(pool->ids[k], NULL);
    pthread_cond_destroy(&pool->go);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

/* A loop object's close(): its pool (at *slot, taken out of it) stopped without the GIL; a
 * later queue starts another. Call with the GIL held. */
static void pool_release(work_pool **slot) {
    work_pool *pool = *slot;
    *slot = NULL;
    if (pool == NULL) return;
    Py_BEGIN_ALLOW_THREADS pool_stop(pool);
    Py_END_ALLOW_THREADS
}
