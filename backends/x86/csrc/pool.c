/* The thread pool of pool.h. Two events, each a counter that only grows: `generation` (a region starts)
 * and `barrier_phase` (everyone reached a barrier; a region also ends with one). A waiter spins a little,
 * then sleeps on one condition variable; whoever bumps a counter broadcasts when someone sleeps. Sleeping
 * matters on a busy machine: a spinning waiter would burn the time slice its laggard partner needs. */
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Pause loops before sleeping. Between two steps of one emg_train_steps call the workers wait only for the
 * caller to pack the next batch (a few us); between Python calls they soon sleep and cost nothing. */
#define SPIN_REGION (1 << 14)
#define SPIN_BARRIER (1 << 12)

struct worker {
    struct emg_pool *pool;
    int tid;
};

struct emg_pool {
    int n;
    pthread_t *threads;
    struct worker *workers;
    emg_pool_fn fn;
    void *ctx;
    int started;  /* threads successfully created */
    int stopping; /* read by workers after a generation change */
    _Alignas(64) atomic_uint generation;
    _Alignas(64) atomic_uint barrier_phase;
    _Alignas(64) atomic_int barrier_count;
    _Alignas(64) atomic_int sleepers;
    pthread_mutex_t lock;
    pthread_cond_t wake;
};

/* Wait until *counter != seen; returns the new value. */
static unsigned wait_change(struct emg_pool *pool, atomic_uint *counter, unsigned seen, int spins) {
    for (int i = 0; i < spins; i++) {
        const unsigned now = atomic_load_explicit(counter, memory_order_acquire);
        if (now != seen) return now;
        CPU_RELAX();
    }
    pthread_mutex_lock(&pool->lock);
    /* seq_cst: either bump() sees this sleeper, or the load below sees bump()'s new value. */
    atomic_fetch_add(&pool->sleepers, 1);
    unsigned now;
    while ((now = atomic_load(counter)) == seen) pthread_cond_wait(&pool->wake, &pool->lock);
    atomic_fetch_sub(&pool->sleepers, 1);
    pthread_mutex_unlock(&pool->lock);
    return now;
}

static void bump(struct emg_pool *pool, atomic_uint *counter) {
    atomic_fetch_add(counter, 1);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->lock);
    }
}

void emg_pool_barrier(struct emg_pool *pool) {
    if (pool == NULL || pool->n == 1) return;
    const unsigned phase = atomic_load_explicit(&pool->barrier_phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&pool->barrier_count, 1, memory_order_acq_rel) == pool->n - 1) {
        atomic_store_explicit(&pool->barrier_count, 0, memory_order_relaxed);
        bump(pool, &pool->barrier_phase); /* seq_cst: also publishes the reset count */
        return;
    }
    wait_change(pool, &pool->barrier_phase, phase, SPIN_BARRIER);
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct emg_pool *pool = w->pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_change(pool, &pool->generation, seen, SPIN_REGION);
        if (pool->stopping) return NULL;
        pool->fn(pool->ctx, w->tid, pool->n);
        emg_pool_barrier(pool); /* the region's end */
    }
}

struct emg_pool *emg_pool_create(int n) {
    if (n < 1) return NULL;
    struct emg_pool *pool = calloc(1, sizeof *pool);
    if (pool == NULL) return NULL;
    pool->n = n;
    pool->threads = calloc((size_t)n, sizeof *pool->threads);
    pool->workers = calloc((size_t)n, sizeof *pool->workers);
    if (pool->threads == NULL || pool->workers == NULL || pthread_mutex_init(&pool->lock, NULL) != 0) {
        free(pool->threads);
        free(pool->workers);
        free(pool);
        return NULL;
    }
    pthread_cond_init(&pool->wake, NULL);
    for (int t = 1; t < n; t++) {
        pool->workers[t] = (struct worker){pool, t};
        if (pthread_create(&pool->threads[t], NULL, worker_main, &pool->workers[t]) != 0) break;
        pool->started++;
    }
    if (pool->started != n - 1) {
        emg_pool_destroy(pool);
        return NULL;
    }
    return pool;
}

void emg_pool_destroy(struct emg_pool *pool) {
    if (pool == NULL) return;
    pool->stopping = 1;
    bump(pool, &pool->generation);
    for (int t = 1; t <= pool->started; t++) pthread_join(pool->threads[t], NULL);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    free(pool->threads);
    free(pool->workers);
    free(pool);
}

int emg_pool_size(const struct emg_pool *pool) { return pool ? pool->n : 1; }

void emg_pool_run(struct emg_pool *pool, emg_pool_fn fn, void *ctx) {
    if (pool == NULL || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    bump(pool, &pool->generation); /* seq_cst: fn and ctx are visible to every woken worker */
    fn(ctx, 0, pool->n);
    emg_pool_barrier(pool);
}
