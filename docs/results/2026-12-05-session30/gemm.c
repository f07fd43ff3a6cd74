#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define TE 512
static void cvt_store(const float*acc,int rows,uint16_t*out,int ldo){
  for(int m=0;m<rows;m++){__m256bh r=_mm512_cvtneps_pbh(_mm512_load_ps(acc+m*16));_mm256_storeu_si256((__m256i*)(out+(long)m*ldo),(__m256i)r);}
}
// one (32-row block, pair) over K. A either strided rows (lda) or packed tiles
static inline void block(const uint16_t*a0,const uint16_t*a1,long astride,long akstep,const uint16_t*w0,const uint16_t*w1,int KB,uint16_t*y,int N){
  float acc[1024] __attribute__((aligned(64)));
  _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
  for(int kb=0;kb<KB;kb++){_tile_loadd(4,a0+kb*akstep,astride);_tile_loadd(5,a1+kb*akstep,astride);_tile_loadd(6,w0+kb*TE,64);_tile_loadd(7,w1+kb*TE,64);
    _tile_dpbf16ps(0,4,6);_tile_dpbf16ps(1,5,6);_tile_dpbf16ps(2,4,7);_tile_dpbf16ps(3,5,7);}
  _tile_stored(0,acc,64);_tile_stored(1,acc+256,64);_tile_stored(2,acc+512,64);_tile_stored(3,acc+768,64);
  cvt_store(acc,32,y,N); cvt_store(acc+512,32,y+16,N);
}
static cfg_t gcfg __attribute__((aligned(64)));
int main(int argc,char**argv){
  gcfg.palette=1; for(int t=0;t<8;t++){gcfg.colsb[t]=64;gcfg.rows[t]=16;}
  long rc = syscall(SYS_arch_prctl, 0x1023, 18); fprintf(stderr, "prctl %ld\n", rc);
  int M=atoi(argv[1]),K=atoi(argv[2]),N=atoi(argv[3]); int KB=K/32,NB=N/16,NP=NB/2;
  uint16_t*x=aligned_alloc(64,(long)M*K*2); for(long i=0;i<(long)M*K;i++)x[i]=0x3f80^(i&7);
  uint16_t*xpk=aligned_alloc(64,(long)M*K*2);
  uint16_t*w=aligned_alloc(64,(long)N*K*2); for(long i=0;i<(long)N*K;i++)w[i]=0x3c00^(i&15);
  uint16_t*y=aligned_alloc(64,(long)M*N*2);
  long prods=(long)(M/16)*NB*KB;
  #pragma omp parallel
  { _tile_loadconfig(&gcfg); }
  int mcs[]={0,64,128,256,512};
  for(int pk=0;pk<2;pk++) for(int mi=0;mi<5;mi++){ int MC=mcs[mi]; if(pk&&!MC)continue;
    double best=1e9;
    for(int rep=0;rep<7;rep++){
      double t0=now();
      #pragma omp parallel
      { int T=omp_get_num_threads(),id=omp_get_thread_num(); int p0=NP*id/T,p1=NP*(id+1)/T;
        if(pk){ // pack A into [mb][kb][16][32] tiles (each thread its share of row blocks)
          int MBt=M/16; for(int mb=MBt*id/T;mb<MBt*(id+1)/T;mb++) for(int kb=0;kb<KB;kb++) for(int r=0;r<16;r++)
            memcpy(xpk+((long)mb*KB+kb)*TE+r*32, x+(long)(mb*16+r)*K+kb*32, 64);
          #pragma omp barrier
        }
        int mc = MC?MC:M;
        for(int m0=0;m0<M;m0+=mc) for(int p=p0;p<p1;p++){ const uint16_t*w0=w+(long)2*p*KB*TE,*w1=w0+KB*TE;
          for(int m=m0;m<m0+mc&&m<M;m+=32){
            if(pk) block(xpk+(long)(m/16)*KB*TE, xpk+(long)(m/16+1)*KB*TE, 64, TE, w0,w1,KB,y+(long)m*N+p*32,N);
            else block(x+(long)m*K, x+(long)(m+16)*K, K*2, 32, w0,w1,KB,y+(long)m*N+p*32,N);
          }}
      }
      double t=now()-t0; if(rep&&t<best)best=t;
    }
    printf("M=%d K=%d N=%d %s MC=%4d: %.3f ms  %.2f TMAC/s  %.2f ns/product/thread\n",M,K,N,pk?"packed ":"strided",MC,best*1e3,(double)M*N*K/best/1e12, best/(prods/2.0)*1e9);
  }
}
