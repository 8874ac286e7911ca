// random_fill.cpp: fill_normal (random_fill.h): the model's weight initialisation, 437M draws for hgrn2-385m and
// 1.13B for hgrn2-1b (each a Philox block, a log, a square root and a cosine: tens of seconds on one thread).
#include "core/random_fill.h"

#include <algorithm>

#include "core/check.h"

namespace hgrn {

void fill_normal(Tensor& t, double scale, Rng& rng) {
  HGRN_CHECK(t.device() == Device::CPU && t.is_contiguous(), "fill_normal: needs a contiguous CPU tensor, got ",
             shape_str(t.shape()), " on ", device_name(t.device()));
  const RngState start = rng.state();
  const int64_t n = t.numel();
  constexpr int64_t kBlock = 1 << 16;  // elements per task: each task repositions its generator once
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    Rng local(RngState{start.seed, start.counter + static_cast<uint64_t>(b * kBlock)});
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) t.set_item(i, scale * local.normal());
  }
  rng.set_state({start.seed, start.counter + static_cast<uint64_t>(n)});
}

}  // namespace hgrn
