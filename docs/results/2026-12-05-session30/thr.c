#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  syscall(SYS_arch_prctl, 0x1023, 18);
  static char buf[16*64*8] __attribute__((aligned(64)));
  memset(buf,0,sizeof buf);
  int N=2000000;
  for (int R=1; R<=16; R*=2) {
  cfg_t a={0}; a.palette=1;
  for(int t=0;t<8;t++){a.colsb[t]=64;a.rows[t]=(t<4||t>=6)?R:16;}
  _tile_loadconfig(&a);
  _tile_loadd(4,buf,64); _tile_loadd(5,buf+1024,64);_tile_loadd(6,buf,64);_tile_loadd(7,buf,64);
  double t0=now();
  for(int i=0;i<N;i++){ _tile_dpbf16ps(0,6,4);_tile_dpbf16ps(1,6,5);_tile_dpbf16ps(2,7,4);_tile_dpbf16ps(3,7,5);}
  double t1=now();
  for(int i=0;i<N;i++){ _tile_loadd(6,buf,64); _tile_dpbf16ps(0,6,4);_tile_dpbf16ps(1,6,5);_tile_loadd(7,buf+2048,64);_tile_dpbf16ps(2,7,4);_tile_dpbf16ps(3,7,5);}
  double t2=now();
  _tile_release();
  printf("A rows %2d: 4 products %.2f ns (%.2f per product); with 2 A loads %.2f ns\n",R,(t1-t0)/N*1e9,(t1-t0)/N*1e9/4,(t2-t1)/N*1e9);
  }
}
