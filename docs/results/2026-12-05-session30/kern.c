#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define TE 512
// x: [M][K] bf16, w packed [NB][KB][512]. DIST > 0: software prefetch of the weights DIST
// k-blocks ahead (hint T0 / T1 / T2), in the first pass (PASS 0) or the last (PASS 1).
static int DIST=0, HINT=0, PASS=0;
static void v0(const uint16_t*xp,int K,const uint16_t*wp,int NP,int M,float*acc){
  int KB=K/32; long xs=K*2;
  for(int p=0;p<NP;p++){const uint16_t*w0=wp+(long)2*p*KB*TE,*w1=w0+KB*TE;
    for(int m0=0;m0<M;m0+=32){const uint16_t*x0=xp+(long)m0*K;
      _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
      const int pf = DIST>0 && (PASS==0 ? m0==0 : m0+32>=M);
      for(int kb=0;kb<KB;kb++){
        if(pf){ // prefetch DIST k-blocks ahead in the contiguous stream of this pair (w0 then w1 then next pair)
          const char*a=(const char*)(w0+(long)(kb+DIST)*TE), *b=(const char*)(w1+(long)(kb+DIST)*TE);
          if(HINT==0) for(int l=0;l<1024;l+=64){_mm_prefetch(a+l,_MM_HINT_T0);_mm_prefetch(b+l,_MM_HINT_T0);}
          else if(HINT==1) for(int l=0;l<1024;l+=64){_mm_prefetch(a+l,_MM_HINT_T1);_mm_prefetch(b+l,_MM_HINT_T1);}
          else for(int l=0;l<1024;l+=64){_mm_prefetch(a+l,_MM_HINT_T2);_mm_prefetch(b+l,_MM_HINT_T2);}
        }
        _tile_loadd(4,x0+kb*32,xs);_tile_loadd(5,x0+16*K+kb*32,xs);_tile_loadd(6,w0+kb*TE,64);_tile_loadd(7,w1+kb*TE,64);
        _tile_dpbf16ps(0,4,6);_tile_dpbf16ps(1,5,6);_tile_dpbf16ps(2,4,7);_tile_dpbf16ps(3,5,7);}
      _tile_stored(0,acc,64);_tile_stored(1,acc+256,64);_tile_stored(2,acc+512,64);_tile_stored(3,acc+768,64);}}}
// no loads: products only
static void vnl(const uint16_t*xp,int K,const uint16_t*wp,int NP,int M,float*acc){
  int KB=K/32;
  for(int p=0;p<NP;p++){ for(int m0=0;m0<M;m0+=32){
      _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
      for(int kb=0;kb<KB;kb++){ _tile_dpbf16ps(0,4,6);_tile_dpbf16ps(1,5,6);_tile_dpbf16ps(2,4,7);_tile_dpbf16ps(3,5,7);}
      _tile_stored(0,acc,64);_tile_stored(1,acc+256,64);_tile_stored(2,acc+512,64);_tile_stored(3,acc+768,64);}}}
// weights loads only from memory, A fixed
static void vw(const uint16_t*xp,int K,const uint16_t*wp,int NP,int M,float*acc){
  int KB=K/32;
  for(int p=0;p<NP;p++){const uint16_t*w0=wp+(long)2*p*KB*TE,*w1=w0+KB*TE;
    for(int m0=0;m0<M;m0+=32){
      _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
      for(int kb=0;kb<KB;kb++){_tile_loadd(6,w0+kb*TE,64);_tile_loadd(7,w1+kb*TE,64);
        _tile_dpbf16ps(0,4,6);_tile_dpbf16ps(1,5,6);_tile_dpbf16ps(2,4,7);_tile_dpbf16ps(3,5,7);}
      _tile_stored(0,acc,64);_tile_stored(1,acc+256,64);_tile_stored(2,acc+512,64);_tile_stored(3,acc+768,64);}}}
// A loads only
static void va(const uint16_t*xp,int K,const uint16_t*wp,int NP,int M,float*acc){
  int KB=K/32; long xs=K*2;
  for(int p=0;p<NP;p++){
    for(int m0=0;m0<M;m0+=32){const uint16_t*x0=xp+(long)m0*K;
      _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
      for(int kb=0;kb<KB;kb++){_tile_loadd(4,x0+kb*32,xs);_tile_loadd(5,x0+16*K+kb*32,xs);
        _tile_dpbf16ps(0,4,6);_tile_dpbf16ps(1,5,6);_tile_dpbf16ps(2,4,7);_tile_dpbf16ps(3,5,7);}
      _tile_stored(0,acc,64);_tile_stored(1,acc+256,64);_tile_stored(2,acc+512,64);_tile_stored(3,acc+768,64);}}}
int main(int argc,char**argv){
  syscall(SYS_arch_prctl, 0x1023, 18);
  cfg_t c={0}; c.palette=1; for(int t=0;t<8;t++){c.colsb[t]=64;c.rows[t]=16;}
  _tile_loadconfig(&c);
  int K=576,N=576,M=64; int KB=K/32,NB=N/16;
  uint16_t*x=aligned_alloc(64,M*K*2); memset(x,0,M*K*2);
  long wsz=(long)NB*KB*TE*2; int copies = 400; // 400 copies = cold (265 MB)
  uint16_t*w=aligned_alloc(64,wsz*copies+65536); memset(w,0,wsz*copies+65536);  // slack: prefetches run past the end
  float acc[1024] __attribute__((aligned(64)));
  if(argc>1&&!strcmp(argv[1],"prefetch")){  // ./kern prefetch: v0 cold with software prefetch
  int dists[]={0,1,2,4,8,16};
  for(PASS=0;PASS<2;PASS++) for(HINT=0;HINT<3;HINT++) for(int d=0;d<6;d++){ DIST=dists[d]; if(DIST==0&&(HINT||PASS))continue;
   for(int mm=32;mm<=64;mm+=32){ if(PASS==1&&mm==32)continue;
    double best=1e9;
    for(int r=0;r<3;r++){double t0=now(); for(int i=0;i<copies;i++) v0(x,K,w+(long)i*wsz/2,NB/2,mm,acc); double t=now()-t0; if(t<best)best=t;}
    long prods=(long)copies*(NB/2)*(mm/32)*KB*4;
    printf("pass%d hint T%d dist %2d M=%d: %.2f ns/product  %.1f GB/s\n",PASS,HINT,DIST,mm,best/prods*1e9, wsz*copies/best/1e9);
  }}
    return 0;
  }
  void (*fs[])(const uint16_t*,int,const uint16_t*,int,int,float*)={v0,vnl,vw,va};
  const char*names[]={"full","products only","w loads+prod","A loads+prod"};
  for(int hot=0;hot<2;hot++) for(int f=0;f<4;f++) for(int mm=32;mm<=64;mm+=32){
    double best=1e9;
    for(int r=0;r<3;r++){double t0=now(); for(int i=0;i<copies;i++) fs[f](x,K,w+(hot?0:(long)i*wsz/2),NB/2,mm,acc); double t=now()-t0; if(t<best)best=t;}
    long prods=(long)copies*(NB/2)*(mm/32)*KB*4;
    printf("%s %-14s M=%d: %.2f ns/product\n",hot?"hot ":"cold",names[f],mm,best/prods*1e9);
  }
}
