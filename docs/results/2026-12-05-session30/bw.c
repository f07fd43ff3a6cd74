#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  size_t sizes[]={1<<20,4<<20,16<<20,64<<20,128<<20,256<<20,384<<20,1024ull<<20};
  for(int s=0;s<8;s++){
    size_t n=sizes[s]; char*buf=aligned_alloc(64,n);
    for(size_t i=0;i<n;i+=4096)buf[i]=1;
    for(size_t i=0;i<n;i++)buf[i]=(char)i;
    int reps = (int)((2048ull<<20)/n); if(reps<2)reps=2;
    double best=1e9; __m512i acc=_mm512_setzero_si512();
    for(int r=0;r<reps+1;r++){
      double t0=now();
      #pragma omp parallel
      { __m512i a=_mm512_setzero_si512(); int T=omp_get_num_threads(),id=omp_get_thread_num();
        size_t chunk=n/T; const char*p=buf+id*chunk;
        for(size_t i=0;i<chunk;i+=256){a=_mm512_xor_si512(a,_mm512_load_si512(p+i));a=_mm512_xor_si512(a,_mm512_load_si512(p+i+64));a=_mm512_xor_si512(a,_mm512_load_si512(p+i+128));a=_mm512_xor_si512(a,_mm512_load_si512(p+i+192));}
        #pragma omp critical
        acc=_mm512_xor_si512(acc,a);}
      double t=now()-t0; if(r>0&&t<best)best=t;
    }
    printf("%6zu MB  %.1f GB/s  (%d)\n", n>>20, n/best/1e9, _mm_cvtsi128_si32(_mm512_castsi512_si128(acc))&1);
    free(buf);
  }
}
