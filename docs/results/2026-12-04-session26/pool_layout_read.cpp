#include <immintrin.h>
#include <omp.h>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <vector>
#include <algorithm>
#include <random>
#include <cstring>
// A K block and a V block (each 16 slots x 384 B = 6 KB) per step, random blocks of a 300 MB pool,
// 2 threads. mode 0: each block read line by line in order; mode 1: three passes per block, pass h
// reading lines 2h, 2h+1 of every slot (the [slot][kv_head][dim] layout read one KV head at a time);
// mode 2: head-major ([kv_head][slot][dim]): pass h reads a contiguous 2 KB.
int main(int argc, char** argv) {
  const size_t pool = 300ul << 20, blk = 6144; const int mode = atoi(argv[1]);
  char* p = (char*)aligned_alloc(4096, pool); memset(p, 1, pool);
  const size_t n = pool / blk / 2; std::vector<size_t> kb(n), vb(n);
  std::vector<size_t> idx(pool / blk); for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::mt19937 g(0); std::shuffle(idx.begin(), idx.end(), g);
  for (size_t i = 0; i < n; ++i) { kb[i] = idx[2 * i]; vb[i] = idx[2 * i + 1]; }
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now(); float tot = 0;
#pragma omp parallel num_threads(2) reduction(+:tot)
    {
      __m512 acc = _mm512_setzero_ps();
#pragma omp for schedule(static)
      for (size_t i = 0; i < n; ++i) {
        const char* k = p + kb[i] * blk; const char* v = p + vb[i] * blk;
        for (int h = 0; h < 3; ++h) {
          for (const char* b : {k, v}) {
            if (mode == 0) { if (h == 0) for (size_t o = 0; o < blk; o += 64) acc = _mm512_add_ps(acc, _mm512_load_ps((const float*)(b + o))); }
            else if (mode == 1) { for (int s = 0; s < 16; ++s) for (int l = 0; l < 2; ++l) acc = _mm512_add_ps(acc, _mm512_load_ps((const float*)(b + s * 384 + h * 128 + l * 64))); }
            else { for (int o = 0; o < 2048; o += 64) acc = _mm512_add_ps(acc, _mm512_load_ps((const float*)(b + h * 2048 + o))); }
          }
        }
      }
      tot += _mm512_reduce_add_ps(acc);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep == 4) printf("mode %d: %.1f GB/s (%g)\n", mode, pool / s / 1e9, tot);
  }
}
