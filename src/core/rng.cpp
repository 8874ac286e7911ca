// rng.cpp: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
#include "core/rng.h"

#include <cmath>

namespace hgrn {

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(M0) * c[0];
    uint64_t p1 = static_cast<uint64_t>(M1) * c[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += W0;
    k[1] += W1;
  }
  return c;
}

std::array<uint32_t, 4> Rng::next_block() {
  uint64_t n = state_.counter++;
  return philox4x32_10({static_cast<uint32_t>(n), static_cast<uint32_t>(n >> 32), 0u, 0u},
                       {static_cast<uint32_t>(state_.seed), static_cast<uint32_t>(state_.seed >> 32)});
}

Rng Rng::fork(uint64_t stream) const {
  // Derive a new key from (seed, stream) through Philox itself so that nearby streams are unrelated.
  auto b = philox4x32_10({static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32), 0x5eedu, 0xf0e4u},
                         {static_cast<uint32_t>(state_.seed), static_cast<uint32_t>(state_.seed >> 32)});
  return Rng(RngState{(static_cast<uint64_t>(b[0]) << 32) | b[1], 0});
}

uint32_t Rng::next_u32() { return next_block()[0]; }

uint64_t Rng::next_u64() {
  auto b = next_block();
  return (static_cast<uint64_t>(b[0]) << 32) | b[1];
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  auto b = next_block();
  uint64_t a = ((static_cast<uint64_t>(b[0]) << 32) | b[1]) >> 11;
  uint64_t c = ((static_cast<uint64_t>(b[2]) << 32) | b[3]) >> 11;
  double u1 = (static_cast<double>(a) + 0.5) * 0x1.0p-53;  // (0, 1): log is finite
  double u2 = static_cast<double>(c) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t Rng::below(uint64_t n) {
  if (n <= 1) return 0;
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // reject the top sliver so every residue is equally likely
  for (;;) {
    uint64_t x = next_u64();
    if (x < limit) return x % n;
  }
}

}  // namespace hgrn
