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
// x: [M][K] bf16, w packed [NB][KB][512]
static void v0(const uint16_t*xp,int K,const uint16_t*wp,int NP,int M,float*acc){
  int KB=K/32; long xs=K*2;
  for(int p=0;p<NP;p++){const uint16_t*w0=wp+(long)2*p*KB*TE,*w1=w0+KB*TE;
    for(int m0=0;m0<M;m0+=32){const uint16_t*x0=xp+(long)m0*K;
      _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
      for(int kb=0;kb<KB;kb++){_tile_loadd(4,x0+kb*32,xs);_tile_loadd(5,x0+16*K+kb*32,xs);_tile_loadd(6,w0+kb*TE,64);_tile_loadd(7,w1+kb*TE,64);
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
  uint16_t*w=aligned_alloc(64,wsz*copies); memset(w,0,wsz*copies);
  float acc[1024] __attribute__((aligned(64)));
  void (*fs[])(const uint16_t*,int,const uint16_t*,int,int,float*)={v0,vnl,vw,va};
  const char*names[]={"full","products only","w loads+prod","A loads+prod"};
  for(int hot=0;hot<2;hot++) for(int f=0;f<4;f++) for(int mm=32;mm<=64;mm+=32){
    double best=1e9;
    for(int r=0;r<3;r++){double t0=now(); for(int i=0;i<copies;i++) fs[f](x,K,w+(hot?0:(long)i*wsz/2),NB/2,mm,acc); double t=now()-t0; if(t<best)best=t;}
    long prods=(long)copies*(NB/2)*(mm/32)*KB*4;
    printf("%s %-14s M=%d: %.2f ns/product\n",hot?"hot ":"cold",names[f],mm,best/prods*1e9);
  }
}
