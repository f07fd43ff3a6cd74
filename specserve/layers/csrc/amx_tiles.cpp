// What every AMX kernel here shares (amx_linear.cpp, paged_attention.cpp's Q.K^T): whether this
// build has the tile instructions, the process's permission to use them, and the tile-config
// layout. First in the concatenated translation unit (paged_attention_ext._SOURCE_PATHS).

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define SPECSERVE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

#ifdef SPECSERVE_AMX
// Linux hands a process AMX's 8 KB of tile state only on request.
bool amx_permitted() {
  static const bool ok = [] {
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// The 64-byte operand of ldtilecfg (palette 1): rows and bytes per row of each of the 8 tiles.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
#else
bool amx_permitted() { return false; }
#endif

}  // namespace
