// rng.h: a counter-based random number generator (Philox4x32-10), explicit and seedable.
// Its whole state is (seed, counter): two integers that a checkpoint stores and a resume restores exactly.
// Every draw consumes whole counter blocks, so the same state always yields the same stream on any machine.
#pragma once
#include <array>
#include <cstdint>

namespace hgrn {

struct RngState {
  uint64_t seed = 0;
  uint64_t counter = 0;  // number of 128-bit blocks consumed
  bool operator==(const RngState&) const = default;
};

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { state_.seed = seed; }
  explicit Rng(RngState state) : state_(state) {}

  RngState state() const { return state_; }
  void set_state(RngState s) { state_ = s; }

  // A generator for a sub-stream: same seed mixed with a stream id, counter 0 (e.g. one per data-parallel rank).
  Rng fork(uint64_t stream) const;

  std::array<uint32_t, 4> next_block();  // 4 x 32 random bits, advances the counter by one
  uint32_t next_u32();                   // one block per call (simple and resumable; speed is not a concern here)
  uint64_t next_u64();
  double uniform();                      // [0, 1), 53 random bits
  double normal();                       // standard normal, Box-Muller on one block
  uint64_t below(uint64_t n);            // uniform integer in [0, n), unbiased

 private:
  RngState state_;
};

// The Philox4x32-10 bijection itself, exposed for tests (known-answer vectors) and for the CUDA kernels.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

}  // namespace hgrn
