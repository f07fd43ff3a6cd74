#include <immintrin.h>
#include <omp.h>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <vector>
#include <algorithm>
#include <random>
#include <cstring>
#include <sys/mman.h>
#ifndef NT
#define NT 2
#endif
// Read N chunks of `chunk` bytes at random chunk positions in a pool, 2 threads; pf = prefetch distance in chunks.
int main(int argc, char** argv) {
  size_t pool = 300ul << 20; size_t chunk = atol(argv[1]); int pf = atoi(argv[2]); int work = argc > 3 ? atoi(argv[3]) : 0;
  char* p = (char*)aligned_alloc(2 << 20, pool); if (getenv("HUGE")) madvise(p, pool, MADV_HUGEPAGE); memset(p, 1, pool);
  size_t n = pool / chunk; std::vector<size_t> idx(n); for (size_t i = 0; i < n; ++i) idx[i] = i;
  std::mt19937 g(0); std::shuffle(idx.begin(), idx.end(), g); if (getenv("SMALL")) for (auto& x : idx) x %= 64;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    float tot = 0;
#pragma omp parallel num_threads(NT) reduction(+:tot)
    {
      __m512 acc = _mm512_setzero_ps();
#pragma omp for schedule(static)
      for (size_t i = 0; i < n; ++i) {
        if (pf && i + pf < n) { const char* q = p + idx[i + pf] * chunk; for (size_t b = 0; b < chunk; b += 64) _mm_prefetch(q + b, _MM_HINT_T1); }
        const char* c = p + idx[i] * chunk;
        for (size_t b = 0; b < chunk; b += 64) acc = _mm512_add_ps(acc, _mm512_load_ps((const float*)(c + b)));
        __m512 w0 = acc, w1 = acc, w2 = acc, w3 = acc; const __m512 m = _mm512_set1_ps(0.999f);
        for (int k = 0; k < work; ++k) { w0 = _mm512_fmadd_ps(w0, m, m); w1 = _mm512_fmadd_ps(w1, m, m); w2 = _mm512_fmadd_ps(w2, m, m); w3 = _mm512_fmadd_ps(w3, m, m); }
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_add_ps(w0, w1), _mm512_add_ps(w2, w3))) ;
      }
      tot += _mm512_reduce_add_ps(acc);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("chunk %zu pf %d: %.1f GB/s (%g)\n", chunk, pf, pool / s / 1e9, tot);
  }
}
