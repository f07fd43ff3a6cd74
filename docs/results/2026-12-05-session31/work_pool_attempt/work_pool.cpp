// A small work pool for the extension's kernels: the caller and N - 1 workers take chunks of a
// range from one counter, and the call returns when every chunk is done.
//
// Why not at::parallel_for: torch's pool here is OpenMP, and an OpenMP region ends at a barrier
// that every thread of the team must reach, with or without work left for it. On two cores
// shared with a server's HTTP thread (or a load generator), the OS often deschedules one of the
// two threads for a while; every region then waits for it to come back, even when the other
// thread could do all the work. Here a late worker finds the chunks taken, and the caller never
// waits for a thread, only for chunks already claimed.
//
// Lifetime: the job (a function pointer and its context on the caller's stack) is valid until
// every chunk is done, and a chunk can only be claimed together with its job's generation, so a
// worker that wakes late never runs a stale job. One caller at a time; a nested or concurrent
// call runs inline.

#include <ATen/Parallel.h>
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <sched.h>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace specserve_pool {

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

class WorkPool {
 public:
  using Call = void (*)(const void*, int64_t, int64_t);

  // Never destroyed (workers outlive static teardown). A forked child has no workers: it gets a
  // fresh pool, since the parent's may have been mid-job.
  static WorkPool& get() {
    static const bool registered = [] {
      pthread_atfork(nullptr, nullptr, [] { instance() = new WorkPool(); });
      return true;
    }();
    (void)registered;
    return *instance();
  }

  // call(ctx, b, e) over chunks of [0, n) of `chunk` elements, on up to `threads` threads.
  void run(int64_t n, int64_t chunk, int64_t threads, Call call, const void* ctx) {
    const int64_t nchunks = (n + chunk - 1) / chunk;
    bool idle = false;
    if (nchunks <= 1 || threads <= 1 || in_worker_ || nchunks >= kMaxChunks ||
        !busy_.compare_exchange_strong(idle, true, std::memory_order_acquire)) {
      for (int64_t b = 0; b < n; b += chunk) call(ctx, b, std::min(n, b + chunk));
      return;
    }
    error_ = nullptr;
    ensure_workers(threads - 1);
    call_ = call;
    ctx_ = ctx;
    n_ = n;
    chunk_ = chunk;
    done_.store(0, std::memory_order_relaxed);
    gen_ = (gen_ + 1) & kGenMask;
    claim_.store(pack(gen_, nchunks, 0), std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      wake_.notify_all();
    }
    work(gen_);
    while (done_.load(std::memory_order_acquire) < nchunks) cpu_relax();
    std::exception_ptr error = error_;
    busy_.store(false, std::memory_order_release);
    if (error) std::rethrow_exception(error);
  }

 private:
  static constexpr uint64_t kGenBits = 24, kCountBits = 20;
  static constexpr uint64_t kGenMask = (uint64_t{1} << kGenBits) - 1;
  static constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
  static constexpr int64_t kMaxChunks = int64_t{1} << kCountBits;
  // How long an idle worker spins before it sleeps: long enough to span the gaps between one
  // forward's kernels, short enough to give the core back between steps (to the HTTP thread).
  static constexpr std::chrono::microseconds kSpin{100};

  static WorkPool*& instance() {
    static WorkPool* pool = new WorkPool();
    return pool;
  }

  static uint64_t pack(uint64_t gen, uint64_t nchunks, uint64_t next) {
    return gen << (2 * kCountBits) | nchunks << kCountBits | next;
  }

  // Take chunks of generation `gen` until none is left.
  void work(uint64_t gen) {
    uint64_t v = claim_.load(std::memory_order_acquire);
    while (true) {
      const uint64_t next = v & kCountMask, nchunks = (v >> kCountBits) & kCountMask;
      if ((v >> (2 * kCountBits)) != gen || next >= nchunks) return;
      if (!claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;
      // The job's fields stay valid until this chunk is counted done.
      const int64_t b = static_cast<int64_t>(next) * chunk_;
      try {
        call_(ctx_, b, std::min(n_, b + chunk_));
      } catch (...) {  // the caller rethrows the first, as at::parallel_for does
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
      }
      done_.fetch_add(1, std::memory_order_release);
      v = claim_.load(std::memory_order_acquire);
    }
  }

  void ensure_workers(int64_t want) {
    while (num_workers_ < want) {
      std::thread([this] { worker_loop(); }).detach();
      ++num_workers_;
    }
  }

  void worker_loop() {
    in_worker_ = true;
    if (const char* pin = std::getenv("SPECSERVE_POOL_PIN")) {  // experiment: worker on this CPU
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(std::atoi(pin), &set);
      pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    }
    uint64_t seen = claim_.load(std::memory_order_acquire) >> (2 * kCountBits);
    while (true) {
      uint64_t gen = claim_.load(std::memory_order_acquire) >> (2 * kCountBits);
      const auto until = std::chrono::steady_clock::now() + kSpin;
      while (gen == seen && std::chrono::steady_clock::now() < until) {
        for (int i = 0; i < 64 && gen == seen; ++i) {
          cpu_relax();
          gen = claim_.load(std::memory_order_acquire) >> (2 * kCountBits);
        }
      }
      if (gen == seen) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] {
          gen = claim_.load(std::memory_order_seq_cst) >> (2 * kCountBits);
          return gen != seen;
        });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = gen;
      work(gen);
    }
  }

  std::atomic<bool> busy_{false};  // a caller is running a job
  uint64_t gen_ = 0;               // the caller's side only
  int64_t num_workers_ = 0;
  Call call_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  std::mutex error_mutex_;
  std::exception_ptr error_;
  alignas(64) std::atomic<uint64_t> claim_{0};  // generation | chunk count | next chunk
  alignas(64) std::atomic<int64_t> done_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  static thread_local bool in_worker_;
};

thread_local bool WorkPool::in_worker_ = false;

// at::parallel_for's contract (fn(b, e) over [begin, end), chunks of at least `grain`) on the
// work pool: up to 4 chunks per thread, so that a thread that falls behind hands work over.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t threads = at::get_num_threads();
  const int64_t chunks = std::max<int64_t>(
      1, std::min<int64_t>((n + grain - 1) / std::max<int64_t>(grain, 1), 4 * threads));
  const int64_t chunk = (n + chunks - 1) / chunks;
  struct Ctx {
    const F* fn;
    int64_t begin;
  };
  const Ctx ctx{&fn, begin};
  WorkPool::get().run(n, chunk, threads, [](const void* p, int64_t b, int64_t e) {
    const Ctx* c = static_cast<const Ctx*>(p);
    (*c->fn)(c->begin + b, c->begin + e);
  }, &ctx);
}

}  // namespace specserve_pool
