/* LD_PRELOAD helper for `cluster.sh run`: keeps a finalizing rank's UCX worker progressing
 * while it waits for the other ranks.
 *
 * Why: MPICH 4.0.x (ch4:ucx) closes every endpoint in MPI_Finalize, progresses until its own
 * close requests complete, and then blocks in a PMI barrier without progressing UCX. Over
 * UCX's tcp transport a peer's close can still need an answer from this rank (it sends a
 * small wireup message and waits for the reply), so the peer spins in MPI_Finalize forever
 * and the job never ends (seen in about one run in four across two network namespaces).
 * Later MPICH versions reorder this; with 4.0.2 this helper makes the job end.
 *
 * How: the first ucp_worker_progress() after a ucp_disconnect_nb() (that is, MPICH's close
 * loop in MPI_Finalize) starts a thread that progresses every worker of the process until
 * ucp_worker_destroy(). From then on the calls MPICH makes on those workers
 * (ucp_worker_progress, ucp_request_is_completed, ucp_request_check_status,
 * ucp_request_release, ucp_request_free) are serialized with the thread by one mutex.
 * Before the first disconnect nothing changes but a flag test per progress call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ucp/api/ucp.h>

#define MAX_WORKERS 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static ucp_worker_h workers[MAX_WORKERS];
static int n_workers;
static atomic_int closing;    /* a ucp_disconnect_nb was seen */
static atomic_int helping;    /* the helper thread runs */
static atomic_int stop;
static pthread_t helper;

/* The next definition of name (libucp's), looked up once. */
#define REAL(name)                                                          \
    ({                                                                      \
        static __typeof__(&name) real_##name;                               \
        if (!real_##name) real_##name = (__typeof__(&name))real_symbol(#name); \
        real_##name;                                                        \
    })
static void *real_symbol(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        fprintf(stderr, "ucx_exit_progress: %s not found\n", name);
        abort();
    }
    return f;
}

static void *helper_main(void *arg) {
    (void)arg;
    unsigned (*progress)(ucp_worker_h) = REAL(ucp_worker_progress);
    const struct timespec pause = {0, 200 * 1000};
    while (!atomic_load(&stop)) {
        pthread_mutex_lock(&lock);
        for (int i = 0; i < n_workers; i++)
            if (workers[i]) progress(workers[i]);
        pthread_mutex_unlock(&lock);
        nanosleep(&pause, NULL);
    }
    return NULL;
}

ucs_status_t ucp_worker_create(ucp_context_h context, const ucp_worker_params_t *params,
                               ucp_worker_h *worker_p) {
    ucs_status_t s = REAL(ucp_worker_create)(context, params, worker_p);
    if (s == UCS_OK) {
        pthread_mutex_lock(&lock);
        if (n_workers < MAX_WORKERS) workers[n_workers++] = *worker_p;
        pthread_mutex_unlock(&lock);
    }
    return s;
}

void ucp_worker_destroy(ucp_worker_h worker) {
    if (atomic_exchange(&helping, 0)) {
        atomic_store(&stop, 1);
        pthread_join(helper, NULL);
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_workers; i++)
        if (workers[i] == worker) workers[i] = NULL;
    pthread_mutex_unlock(&lock);
    REAL(ucp_worker_destroy)(worker);
}

ucs_status_ptr_t ucp_disconnect_nb(ucp_ep_h ep) {
    atomic_store(&closing, 1);
    pthread_mutex_lock(&lock);
    ucs_status_ptr_t r = REAL(ucp_disconnect_nb)(ep);
    pthread_mutex_unlock(&lock);
    return r;
}

unsigned ucp_worker_progress(ucp_worker_h worker) {
    if (!atomic_load(&closing)) return REAL(ucp_worker_progress)(worker);
    if (!atomic_load(&helping) && !atomic_load(&stop)) {
        atomic_store(&helping, 1);
        if (pthread_create(&helper, NULL, helper_main, NULL) != 0) atomic_store(&helping, 0);
    }
    pthread_mutex_lock(&lock);
    unsigned n = REAL(ucp_worker_progress)(worker);
    pthread_mutex_unlock(&lock);
    return n;
}

#define SERIALIZED(ret, name, type, arg)                                   \
    ret name(type arg) {                                                   \
        if (!atomic_load(&closing)) return REAL(name)(arg);                \
        pthread_mutex_lock(&lock);                                         \
        ret r = REAL(name)(arg);                                           \
        pthread_mutex_unlock(&lock);                                       \
        return r;                                                          \
    }
SERIALIZED(int, ucp_request_is_completed, void *, request)
SERIALIZED(ucs_status_t, ucp_request_check_status, void *, request)

void ucp_request_release(void *request) {
    if (!atomic_load(&closing)) { REAL(ucp_request_release)(request); return; }
    pthread_mutex_lock(&lock);
    REAL(ucp_request_release)(request);
    pthread_mutex_unlock(&lock);
}

void ucp_request_free(void *request) {
    if (!atomic_load(&closing)) { REAL(ucp_request_free)(request); return; }
    pthread_mutex_lock(&lock);
    REAL(ucp_request_free)(request);
    pthread_mutex_unlock(&lock);
}
