// random_fill.h: fills a CPU tensor with scaled standard normal draws of an Rng, in parallel, with exactly the values
// (and the generator state afterwards) of the sequential loop `for i: t[i] = scale * rng.normal()`.
#pragma once
#include "core/rng.h"
#include "core/tensor.h"

namespace hgrn {

// t (a contiguous CPU tensor of any dtype; values are rounded to it as set_item rounds) gets scale · N(0, 1) draws.
// Rng::normal takes one counter block per draw, so element i is the draw at counter (start + i): each thread starts
// its own generator there, and the values do not depend on the thread count. rng ends numel() blocks further on.
void fill_normal(Tensor& t, double scale, Rng& rng);

}  // namespace hgrn
