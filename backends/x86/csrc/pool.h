/* A persistent pool of worker threads for one session: created once, woken per parallel region.
 * The caller is participant 0 and runs its share too; workers spin briefly after each region (steps are
 * 20-2000 us apart inside one emg_train_steps call), then sleep on a condition variable so an idle session
 * costs no CPU. Nothing here knows about the model. */
#ifndef EMG_X86_POOL_H
#define EMG_X86_POOL_H

/* fn(ctx, tid, n) runs once on every participant tid in 0..n-1. */
typedef void (*emg_pool_fn)(void *ctx, int tid, int n);

struct emg_pool;

/* A pool of n participants (the caller plus n - 1 threads); NULL when a thread cannot be started. */
struct emg_pool *emg_pool_create(int n);
void emg_pool_destroy(struct emg_pool *pool);
int emg_pool_size(const struct emg_pool *pool);

/* Run fn on every participant and return when all have finished. pool NULL runs fn(ctx, 0, 1) inline. */
void emg_pool_run(struct emg_pool *pool, emg_pool_fn fn, void *ctx);

/* Inside fn: wait until every participant has reached this barrier (no-op for a NULL or 1-thread pool). */
void emg_pool_barrier(struct emg_pool *pool);

#endif /* EMG_X86_POOL_H */
