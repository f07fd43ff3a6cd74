#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define NR 3
#define NC 4
#define TILE 32
static uint16_t V[TILE][64] __attribute__((aligned(64)));
static float P[NR][TILE] __attribute__((aligned(64)));
static float acc[NR][64] __attribute__((aligned(64)));
__attribute__((noinline)) void fma_pv(){
  __m512 a[NR][NC];
  for(int i=0;i<NR;i++)for(int c=0;c<NC;c++)a[i][c]=_mm512_load_ps(&acc[i][16*c]);
  for(int j=0;j<TILE;j++){
    for(int c=0;c<NC;c++){ __m512 v=_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)&V[j][16*c])),16));
      for(int i=0;i<NR;i++) a[i][c]=_mm512_fmadd_ps(_mm512_set1_ps(P[i][j]),v,a[i][c]);}
  }
  for(int i=0;i<NR;i++)for(int c=0;c<NC;c++)_mm512_store_ps(&acc[i][16*c],a[i][c]);
}
__attribute__((noinline)) void dp_pv(int lo_too){
  uint32_t ph[NR][16] __attribute__((aligned(64))), pl[NR][16] __attribute__((aligned(64)));
  __m512 a[NR][NC];
  for(int i=0;i<NR;i++){ __m512 p0=_mm512_load_ps(P[i]),p1=_mm512_load_ps(P[i]+16);
    __m512i hb=(__m512i)_mm512_cvtne2ps_pbh(p1,p0);
    __m512 h0=_mm512_cvtpbh_ps((__m256bh)_mm512_castsi512_si256(hb)),h1=_mm512_cvtpbh_ps((__m256bh)_mm512_extracti64x4_epi64(hb,1));
    _mm512_store_si512(ph[i],hb); _mm512_store_si512(pl[i],(__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(p1,h1),_mm512_sub_ps(p0,h0)));
    for(int c=0;c<NC;c++)a[i][c]=_mm512_load_ps(&acc[i][16*c]);}
  const __m512i lo=_mm512_set_epi16(47,15,46,14,45,13,44,12,43,11,42,10,41,9,40,8,39,7,38,6,37,5,36,4,35,3,34,2,33,1,32,0);
  const __m512i hi=_mm512_add_epi16(lo,_mm512_set1_epi16(16));
  for(int j=0;j<TILE;j+=2){
    for(int h=0;h<NC/2;h++){
      __m512i x=_mm512_loadu_si512(&V[j][32*h]),y=_mm512_loadu_si512(&V[j+1][32*h]);
      __m512bh v0=(__m512bh)_mm512_permutex2var_epi16(x,lo,y),v1=(__m512bh)_mm512_permutex2var_epi16(x,hi,y);
      for(int i=0;i<NR;i++){ __m512bh bh=(__m512bh)_mm512_set1_epi32(ph[i][j/2]);
        a[i][2*h]=_mm512_dpbf16_ps(a[i][2*h],v0,bh); a[i][2*h+1]=_mm512_dpbf16_ps(a[i][2*h+1],v1,bh);
        if(lo_too){ __m512bh bl=(__m512bh)_mm512_set1_epi32(pl[i][j/2]);
        a[i][2*h]=_mm512_dpbf16_ps(a[i][2*h],v0,bl); a[i][2*h+1]=_mm512_dpbf16_ps(a[i][2*h+1],v1,bl);}
      }}}
  for(int i=0;i<NR;i++)for(int c=0;c<NC;c++)_mm512_store_ps(&acc[i][16*c],a[i][c]);
}
__attribute__((noinline)) void perm_only(){
  __m512i a=_mm512_setzero_si512();
  const __m512i lo=_mm512_set_epi16(47,15,46,14,45,13,44,12,43,11,42,10,41,9,40,8,39,7,38,6,37,5,36,4,35,3,34,2,33,1,32,0);
  for(int j=0;j<TILE;j+=2) for(int h=0;h<2;h++){__m512i x=_mm512_loadu_si512(&V[j][32*h]),y=_mm512_loadu_si512(&V[j+1][32*h]);
    a=_mm512_xor_si512(a,_mm512_permutex2var_epi16(x,lo,y)); a=_mm512_xor_si512(a,_mm512_permutex2var_epi16(y,lo,x));}
  _mm512_store_si512(acc[0],a);
}
int main(){
  for(int j=0;j<TILE;j++)for(int d=0;d<64;d++)V[j][d]=0x3f80;
  for(int i=0;i<NR;i++)for(int j=0;j<TILE;j++)P[i][j]=0.01f*j;
  int N=2000000; double t0,t1;
  t0=now(); for(int i=0;i<N;i++) fma_pv(); t1=now(); printf("fma    %.1f ns/tile\n",(t1-t0)/N*1e9);
  t0=now(); for(int i=0;i<N;i++) dp_pv(1); t1=now(); printf("dp h+l %.1f ns/tile\n",(t1-t0)/N*1e9);
  t0=now(); for(int i=0;i<N;i++) dp_pv(0); t1=now(); printf("dp h   %.1f ns/tile\n",(t1-t0)/N*1e9);
  t0=now(); for(int i=0;i<N;i++) perm_only(); t1=now(); printf("perms  %.1f ns/tile\n",(t1-t0)/N*1e9);
}
