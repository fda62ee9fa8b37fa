/* Kiln's thread pool for TVM's parallel loops, linked into every CPU artifact library.

   TVM's own pool splits each parallel loop into one fixed chunk per thread. When another process
   holds one of the cores, the caller finishes its chunk and then waits for a worker the kernel has
   descheduled, a time slice per kernel: ResNet-18 took 80 ms instead of 7 beside one busy process
   (benchmarks/contention.md). Here the chunks are handed out one at a time from a shared counter and
   the calling thread takes them too, so the chunks of a worker that is not running are run by the
   caller instead, and a kernel costs at most its serial time.

   The generated code asks for num_task = 0 and computes its chunk from (task_id, penv->num_task), so
   any num_task is valid. Kiln's schedules never emit TVM's parallel barrier; the runtime installs
   this pool only in libraries that do not import it, by pointing their __TVMBackendParallelLaunch
   (set by TVM's loader) at kiln_pool_launch (runtime/pool.py).

   Written in the common subset of C and C++ (TVM's exporter compiles it with g++), with GCC's
   __atomic builtins; Linux (x86-64 and arm64) with pthreads. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, pthread_setaffinity_np */
#endif
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  void* sync_handle;
  int32_t num_task;
} KilnParallelEnv;
typedef int (*KilnLambda)(int task_id, KilnParallelEnv* penv, void* cdata);

#define KILN_POOL_MAX 64
#define KILN_CHUNKS 4 /* chunks per thread: finer chunks let the caller take over a stalled worker's */

static int n_threads = 1; /* the caller included */
static int n_started = 0; /* workers running */
static long spin_ns = 200000; /* an idle worker spins this long for the next loop, then sleeps */
static pthread_t workers[KILN_POOL_MAX];
static pthread_mutex_t launch_mu = PTHREAD_MUTEX_INITIALIZER; /* one parallel loop at a time */
static pthread_mutex_t sleep_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cv = PTHREAD_COND_INITIALIZER;

/* The current loop. seq is odd while the launcher writes the fields (a seqlock). Thread i (the caller
   is 0) owns the chunks [i*chunks, (i+1)*chunks): the contiguous share TVM's pool would give it, so
   producer and consumer kernels keep their data in the same core's cache. It takes its own first and
   then what the others have not started. ticket[i] holds (seq << 32 | next chunk of range i), so a
   worker that read an older loop's fields can take none of this one's. */
static unsigned seq = 0;
static uint64_t ticket[KILN_POOL_MAX];
static KilnLambda job_f;
static void* job_cdata;
static int job_n;
static int job_ranges;
static int job_done;
static int job_failed;
static int sleepers;
static __thread int inside; /* a parallel loop inside a chunk runs serially */

static inline void relax_cpu(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Take and run chunks of loop `s`, own range first, until none is left. */
static void run_chunks(unsigned s, int self, KilnLambda f, void* cdata, int n, int ranges) {
  KilnParallelEnv env = {0, n};
  int per = n / ranges;
  for (int k = 0; k < ranges; k++) {
    int r = (self + k) % ranges;
    for (;;) {
      uint64_t t = __atomic_load_n(&ticket[r], __ATOMIC_ACQUIRE);
      int task = (int)(t & 0xffffffffu);
      if ((unsigned)(t >> 32) != s) return; /* a newer loop: this one is finished */
      if (task >= (r + 1) * per) break;
      if (!__atomic_compare_exchange_n(&ticket[r], &t, t + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
      inside = 1;
      if (f(task, &env, cdata) != 0) __atomic_store_n(&job_failed, 1, __ATOMIC_RELEASE);
      inside = 0;
      __atomic_fetch_add(&job_done, 1, __ATOMIC_ACQ_REL);
    }
  }
}

/* Worker i runs on the (i+1)-th CPU the process may use (the caller usually keeps the first): two of
   our threads time-sharing one core would run a loop's chunks one after the other. Only inside a CPU
   set chosen for this process (taskset, a container's cpuset, KILN_CPUS, a Ray replica's CPUs): with
   every online CPU allowed, each replica on the host would pin its worker i onto the same core, so
   there the workers are left to the scheduler. */
static void pin(int index) {
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  if (CPU_COUNT(&allowed) >= sysconf(_SC_NPROCESSORS_ONLN)) return;
  int count = CPU_COUNT(&allowed), want = (index + 1) % (count > 0 ? count : 1), k = 0;
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &allowed)) continue;
    if (k++ == want) {
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
      return;
    }
  }
}

static void* worker_main(void* arg) {
  int index = (int)(intptr_t)arg; /* workers past the configured count sit the loops out */
  pin(index);
  unsigned seen = __atomic_load_n(&seq, __ATOMIC_ACQUIRE);
  for (;;) {
    unsigned s;
    long t0 = now_ns();
    int spins = 0;
    for (;;) { /* wait for a new loop: spin, yield, then sleep */
      s = __atomic_load_n(&seq, __ATOMIC_ACQUIRE);
      if (s != seen && !(s & 1u)) break;
      if (++spins < 64) {
        relax_cpu();
        continue;
      }
      spins = 0;
      if (now_ns() - t0 < spin_ns) {
        sched_yield(); /* a process sharing this core runs instead of our spinning */
        continue;
      }
      pthread_mutex_lock(&sleep_mu);
      __atomic_fetch_add(&sleepers, 1, __ATOMIC_SEQ_CST);
      while (__atomic_load_n(&seq, __ATOMIC_SEQ_CST) == seen) pthread_cond_wait(&sleep_cv, &sleep_mu);
      __atomic_fetch_sub(&sleepers, 1, __ATOMIC_SEQ_CST);
      pthread_mutex_unlock(&sleep_mu);
      t0 = now_ns();
    }
    KilnLambda f = __atomic_load_n(&job_f, __ATOMIC_RELAXED);
    void* cdata = __atomic_load_n(&job_cdata, __ATOMIC_RELAXED);
    int n = __atomic_load_n(&job_n, __ATOMIC_RELAXED);
    int ranges = __atomic_load_n(&job_ranges, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    seen = s;
    if (__atomic_load_n(&seq, __ATOMIC_ACQUIRE) != s) continue; /* torn: a newer loop began meanwhile */
    if (index + 1 < ranges) run_chunks(s, index + 1, f, cdata, n, ranges);
  }
  return 0;
}

/* A forked child has none of the parent's workers: it starts its own (until then the caller runs
   every chunk), with fresh locks in case a parent thread held one at the fork. */
static void after_fork_in_child(void) {
  n_started = 0;
  sleepers = 0;
  pthread_mutex_init(&launch_mu, 0);
  pthread_mutex_init(&sleep_mu, 0);
  pthread_cond_init(&sleep_cv, 0);
}

static void start_workers(void) {
  static int fork_handler = 0;
  if (!fork_handler) {
    pthread_atfork(0, 0, after_fork_in_child);
    fork_handler = 1;
  }
  while (n_started < n_threads - 1) {
    if (pthread_create(&workers[n_started], 0, worker_main, (void*)(intptr_t)n_started) != 0) {
      n_threads = n_started + 1; /* run with the threads we could start */
      return;
    }
    pthread_setname_np(workers[n_started], "kiln-pool"); /* what top -H and /proc/<pid>/task/<tid>/comm show */
    n_started++;
  }
}

/* TVMBackendParallelLaunch's contract: run f for task ids 0..num_task-1; nonzero if any failed. */
int kiln_pool_launch(KilnLambda f, void* cdata, int num_task) {
  (void)num_task; /* 0 from TVM's codegen: the pool decides */
  if (inside || n_threads <= 1 || pthread_mutex_trylock(&launch_mu) != 0) {
    KilnParallelEnv env = {0, 1}; /* nested, single-threaded, or another thread's loop is running */
    return f(0, &env, cdata);
  }
  start_workers();
  int ranges = n_threads, n = ranges * KILN_CHUNKS;
  unsigned s = __atomic_load_n(&seq, __ATOMIC_RELAXED);
  __atomic_store_n(&seq, s + 1, __ATOMIC_RELEASE); /* odd: writing */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&job_f, f, __ATOMIC_RELAXED);
  __atomic_store_n(&job_cdata, cdata, __ATOMIC_RELAXED);
  __atomic_store_n(&job_n, n, __ATOMIC_RELAXED);
  __atomic_store_n(&job_ranges, ranges, __ATOMIC_RELAXED);
  __atomic_store_n(&job_done, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&job_failed, 0, __ATOMIC_RELAXED);
  s += 2;
  for (int r = 0; r < ranges; r++) __atomic_store_n(&ticket[r], (uint64_t)s << 32 | (uint64_t)(r * KILN_CHUNKS), __ATOMIC_RELEASE);
  __atomic_store_n(&seq, s, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0) {
    pthread_mutex_lock(&sleep_mu);
    pthread_cond_broadcast(&sleep_cv);
    pthread_mutex_unlock(&sleep_mu);
  }
  run_chunks(s, 0, f, cdata, n, ranges);
  int spins = 0;
  while (__atomic_load_n(&job_done, __ATOMIC_ACQUIRE) < n) { /* a worker is still in a chunk */
    if (++spins < 256) {
      relax_cpu();
    } else {
      sched_yield();
    }
  }
  int failed = __atomic_load_n(&job_failed, __ATOMIC_ACQUIRE);
  pthread_mutex_unlock(&launch_mu);
  return failed ? -1 : 0;
}

/* Threads (the caller included) and the idle workers' spin time. Fewer threads than started: the
   extra workers wake for each loop but take no chunks of it. */
void kiln_pool_configure(int threads, long spin_us) {
  pthread_mutex_lock(&launch_mu);
  __atomic_store_n(&n_threads, threads < 1 ? 1 : (threads > KILN_POOL_MAX ? KILN_POOL_MAX : threads), __ATOMIC_RELAXED);
  if (spin_us >= 0) spin_ns = spin_us * 1000L;
  pthread_mutex_unlock(&launch_mu);
}

#ifdef __cplusplus
}
#endif
