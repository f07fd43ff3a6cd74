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
  cfg_t a={0},b={0}; a.palette=b.palette=1;
  for(int t=0;t<8;t++){a.colsb[t]=64;a.rows[t]=16;b.colsb[t]=64;b.rows[t]=(t==3||t>=6)?3:16;}
  static char buf[16*64*8] __attribute__((aligned(64)));
  memset(buf,0,sizeof buf);
  int N=2000000;
  _tile_loadconfig(&a);
  double t0=now();
  for(int i=0;i<N;i++){ _tile_loadd(2,buf,64); _tile_loadd(4,buf+1024,64); _tile_dpbf16ps(0,2,4);}
  double t1=now();
  for(int i=0;i<N;i++){ _tile_loadconfig(i&1?&a:&b); _tile_loadd(2,buf,64); _tile_loadd(4,buf+1024,64); _tile_dpbf16ps(0,2,4);}
  double t2=now();
  _tile_loadconfig(&b);
  for(int i=0;i<N;i++){ _tile_loadd(6,buf,64); _tile_loadd(2,buf+1024,64); _tile_dpbf16ps(3,6,2);}
  double t3=now();
  _tile_loadconfig(&a);
  for(int i=0;i<N;i++){ _tile_loadd(6,buf,64); _tile_loadd(2,buf+1024,64); _tile_dpbf16ps(3,6,2);}
  double t4=now();
  _tile_release();
  printf("no cfg: %.1f ns/iter; with cfg switch: %.1f ns/iter; 3-row product %.1f ns; 16-row product %.1f ns\n",(t1-t0)/N*1e9,(t2-t1)/N*1e9,(t3-t2)/N*1e9,(t4-t3)/N*1e9);
}
