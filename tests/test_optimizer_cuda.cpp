// test_optimizer_cuda.cpp: AdamW, gradient-norm clipping and zero_grad on fp32 GPU parameters against the same
// optimiser on CPU copies (the CPU path is the reference: test_optimizer.cpp checks it against the formula), the
// checkpoint round trip through CPU tensors, and run-to-run bitwise identity. Skipped (never passed) without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <vector>

#include "gpu_test.h"
#include "gradcheck.h"
#include "train/optimizer.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::max_abs;
using testing::random_tensor;

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

// Odd sizes around the kernels' 4096-element chunk: a lone element, a partial chunk, one chunk and a bit, three
// chunks and a bit; decay alternates; parameter 2 never gets a gradient.
const std::vector<Shape> kShapes = {{1}, {7}, {40, 25}, {4099}, {3, 4097}, {5, 3}};
const std::vector<bool> kDecay = {true, false, true, false, true, true};
constexpr size_t kNoGrad = 2;

struct Params {
  std::vector<Var> vars;
  std::vector<ParamRef> refs;
};

Params make_params(const std::vector<Tensor>& init, Device device) {
  Params p;
  for (size_t i = 0; i < init.size(); ++i) {
    p.vars.push_back(make_var(init[i].to(device), true, "p" + std::to_string(i)));
    p.refs.push_back({p.vars.back(), kDecay[i]});
  }
  return p;
}

std::vector<Tensor> random_init(Rng& rng) {
  std::vector<Tensor> init;
  for (const Shape& s : kShapes) init.push_back(random_tensor(rng, s, 0.5, DType::F32));
  return init;
}

// Gradients of very different scales per parameter (1e-3 … 10), the same values for both devices.
std::vector<Tensor> random_grads(Rng& rng, double scale = 1.0) {
  std::vector<Tensor> grads;
  const double scales[] = {1e-3, 10.0, 1.0, 0.1, 2.0, 1e-2};
  for (size_t i = 0; i < kShapes.size(); ++i) grads.push_back(random_tensor(rng, kShapes[i], scale * scales[i], DType::F32));
  return grads;
}

void set_grads(const Params& p, const std::vector<Tensor>& grads) {
  for (size_t i = 0; i < grads.size(); ++i)
    if (i != kNoGrad) grad_buffer(p.vars[i]).copy_from(grads[i]);
}

const AdamWConfig kConfig{0.9, 0.95, 1e-8, 0.1};

// Five steps of clip + AdamW; returns the norms.
std::vector<double> train(const Params& p, AdamW& opt, uint64_t seed, double max_norm) {
  Rng rng(seed);
  std::vector<double> norms;
  for (int t = 1; t <= 5; ++t) {
    set_grads(p, random_grads(rng));
    norms.push_back(clip_grad_norm(p.refs, max_norm));
    opt.step(3e-2 / t);
  }
  return norms;
}

TEST(OptimizerCuda, AdamWMatchesCpuStepByStep) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(401);
  const std::vector<Tensor> init = random_init(rng);
  Params cpu = make_params(init, Device::CPU), gpu = make_params(init, Device::CUDA);
  AdamW cpu_opt(cpu.refs, kConfig), gpu_opt(gpu.refs, kConfig);
  EXPECT_EQ(gpu_opt.first_moments()[0].device(), Device::CUDA);
  EXPECT_EQ(gpu_opt.second_moments()[3].dtype(), DType::F32);
  bool bitwise = true;
  for (int t = 1; t <= 5; ++t) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    const std::vector<Tensor> grads = random_grads(rng);
    set_grads(cpu, grads);
    set_grads(gpu, grads);
    const double lr = 3e-2 / t;
    cpu_opt.step(lr);
    gpu_opt.step(lr);
    EXPECT_EQ(gpu_opt.step_count(), t);
    for (size_t i = 0; i < init.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "param " << i);
      // The kernel performs the CPU loop's double operations in the same order, each IEEE-rounded (no FMA), so
      // the results should be the same bits; 1e-6 leaves room for one fp32 ulp should a rounding detail differ,
      // and stays far below what a wrong formula (bias correction, decay, step count) would give (>= 1e-3).
      expect_close(gpu.vars[i]->value, cpu.vars[i]->value, 1e-6, 1e-6 * max_abs(cpu.vars[i]->value), "param");
      expect_close(gpu_opt.first_moments()[i], cpu_opt.first_moments()[i], 1e-6,
                   1e-6 * max_abs(cpu_opt.first_moments()[i]), "first moment");
      expect_close(gpu_opt.second_moments()[i], cpu_opt.second_moments()[i], 1e-6,
                   1e-6 * max_abs(cpu_opt.second_moments()[i]), "second moment");
      bitwise = bitwise && same_bits(gpu.vars[i]->value, cpu.vars[i]->value) &&
                same_bits(gpu_opt.first_moments()[i], cpu_opt.first_moments()[i]) &&
                same_bits(gpu_opt.second_moments()[i], cpu_opt.second_moments()[i]);
    }
  }
  // The parameter without a gradient: untouched (not even decayed), moments still zero.
  EXPECT_FALSE(gpu.vars[kNoGrad]->grad.defined());
  EXPECT_TRUE(same_bits(gpu.vars[kNoGrad]->value, init[kNoGrad]));
  EXPECT_EQ(max_abs(gpu_opt.first_moments()[kNoGrad]), 0.0);
  EXPECT_EQ(max_abs(gpu_opt.second_moments()[kNoGrad]), 0.0);
  std::cout << "[   INFO   ] GPU AdamW bitwise equal to the CPU's: " << (bitwise ? "yes" : "no") << "\n";
}

TEST(OptimizerCuda, ClipGradNormMatchesCpu) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(402);
  const std::vector<Tensor> init = random_init(rng);
  Params cpu = make_params(init, Device::CPU), gpu = make_params(init, Device::CUDA);
  // A large gradient as well, spanning many chunks (the two-level device reduction).
  Tensor big = random_tensor(rng, {300001}, 0.01, DType::F32);
  for (Params* p : {&cpu, &gpu}) {
    const Device device = p == &gpu ? Device::CUDA : Device::CPU;
    p->vars.push_back(make_var(Tensor::zeros(big.shape(), DType::F32, device), true, "big"));
    p->refs.push_back({p->vars.back(), true});
  }
  for (double max_norm : {0.0, 1e9, 1.0}) {  // off, above the norm (untouched), below it (scaled)
    SCOPED_TRACE(::testing::Message() << "max_norm " << max_norm);
    const std::vector<Tensor> grads = random_grads(rng, 3.0);
    set_grads(cpu, grads);
    set_grads(gpu, grads);
    grad_buffer(cpu.vars.back()).copy_from(big);
    grad_buffer(gpu.vars.back()).copy_from(big);
    const double cpu_norm = clip_grad_norm(cpu.refs, max_norm);
    const double gpu_norm = clip_grad_norm(gpu.refs, max_norm);
    // Both sum fp32 squares in double, in different orders: rounding differences near 1e-16 relative.
    EXPECT_NEAR(gpu_norm, cpu_norm, 1e-12 * cpu_norm);
    for (size_t i = 0; i < gpu.vars.size(); ++i) {
      if (i == kNoGrad) continue;
      SCOPED_TRACE(::testing::Message() << "param " << i);
      if (max_norm == 1.0) {
        // The same scaling arithmetic; the factor may differ in its last double bits (from the norm), which can
        // move a product across an fp32 rounding boundary: at most one ulp (6e-8 relative).
        expect_close(gpu.vars[i]->grad, cpu.vars[i]->grad, 1e-6, 1e-6 * max_abs(cpu.vars[i]->grad), "clipped grad");
      } else {
        EXPECT_TRUE(same_bits(gpu.vars[i]->grad, cpu.vars[i]->grad)) << "an unclipped gradient must be untouched";
      }
    }
  }
  EXPECT_FALSE(gpu.vars[kNoGrad]->grad.defined());
}

// Clipping folded into the update on the GPU: the same result as the CPU's in-place scaling followed by its step
// (to the tolerance of AdamWMatchesCpuStepByStep; the clip factors may differ in their last double bits), and the
// GPU gradients are not written.
TEST(OptimizerCuda, FoldedClipMatchesTheCpusScaleThenStep) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(404);
  const std::vector<Tensor> init = random_init(rng);
  Params cpu = make_params(init, Device::CPU), gpu = make_params(init, Device::CUDA);
  AdamW cpu_opt(cpu.refs, kConfig), gpu_opt(gpu.refs, kConfig);
  int clipped = 0;
  for (int t = 1; t <= 5; ++t) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    const std::vector<Tensor> grads = random_grads(rng, t % 2 ? 3.0 : 1e-3);  // clipped and unclipped steps
    set_grads(cpu, grads);
    set_grads(gpu, grads);
    const double cpu_norm = clip_grad_norm(cpu.refs, 1.0);
    cpu_opt.step(3e-2 / t);
    const GradNorm gn = grad_norm_and_clip_factor(gpu.refs, 1.0);
    EXPECT_NEAR(gn.norm, cpu_norm, 1e-12 * cpu_norm);
    clipped += gn.clip_factor < 1.0;
    gpu_opt.step(3e-2 / t, gn.clip_factor);
    for (size_t i = 0; i < init.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "param " << i);
      expect_close(gpu.vars[i]->value, cpu.vars[i]->value, 1e-6, 1e-6 * max_abs(cpu.vars[i]->value), "param");
      expect_close(gpu_opt.second_moments()[i], cpu_opt.second_moments()[i], 1e-6,
                   1e-6 * max_abs(cpu_opt.second_moments()[i]), "second moment");
      if (i != kNoGrad) EXPECT_TRUE(same_bits(gpu.vars[i]->grad, grads[i])) << "the gradient must not be written";
    }
  }
  EXPECT_GE(clipped, 2);
  EXPECT_LT(clipped, 5);
}

// clip_and_step keeps the whole step on the device (norm, clip factor, update; nothing waits for the host): the same
// bits as the host-side grad_norm_and_clip_factor + step, for clipped and unclipped steps, a non-finite gradient
// (the step skipped: nothing written, as the host skips it) and a step where one more parameter has no gradient (the
// resident slot table must be replaced, then restored).
TEST(OptimizerCuda, DeviceClipAndStepMatchesHostClipThenStep) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(405);
  const std::vector<Tensor> init = random_init(rng);
  Params host = make_params(init, Device::CUDA), device = make_params(init, Device::CUDA);
  AdamW host_opt(host.refs, kConfig), device_opt(device.refs, kConfig);
  constexpr size_t kSkipped = 4;  // no gradient at step 3
  for (int t = 1; t <= 6; ++t) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    std::vector<Tensor> grads = random_grads(rng, t % 2 ? 3.0 : 1e-3);  // clipped and unclipped steps
    if (t == 5) grads[0].data<float>()[0] = INFINITY;                   // a non-finite norm: unclipped
    for (Params* p : {&host, &device}) {
      set_grads(*p, grads);
      if (t == 3) p->vars[kSkipped]->grad = Tensor();
    }
    const GradNorm gn = grad_norm_and_clip_factor(host.refs, 1.0);
    if (std::isfinite(gn.norm)) host_opt.step(3e-2 / t, gn.clip_factor);
    const double device_norm = device_opt.clip_and_step(3e-2 / t, 1.0)();
    if (t == 5) {
      EXPECT_TRUE(std::isinf(device_norm));
      EXPECT_TRUE(std::isinf(gn.norm));
    } else {
      EXPECT_EQ(std::memcmp(&device_norm, &gn.norm, sizeof(double)), 0) << device_norm << " vs " << gn.norm;
    }
    for (size_t i = 0; i < init.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "param " << i);
      EXPECT_TRUE(same_bits(device.vars[i]->value, host.vars[i]->value));
      EXPECT_TRUE(same_bits(device_opt.first_moments()[i], host_opt.first_moments()[i]));
      EXPECT_TRUE(same_bits(device_opt.second_moments()[i], host_opt.second_moments()[i]));
      if (i != kNoGrad && !(t == 3 && i == kSkipped))
        EXPECT_TRUE(same_bits(device.vars[i]->grad, grads[i])) << "the gradient must not be written";
    }
  }
}

// A non-finite loss on the device (a guard) skips the whole device-side update although the gradients are finite;
// a finite one changes nothing.
TEST(OptimizerCuda, NonFiniteDeviceGuardSkipsTheUpdate) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(406);
  const std::vector<Tensor> init = random_init(rng);
  Params guarded = make_params(init, Device::CUDA), plain = make_params(init, Device::CUDA);
  AdamW guarded_opt(guarded.refs, kConfig), plain_opt(plain.refs, kConfig);
  for (int t = 1; t <= 3; ++t) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    const std::vector<Tensor> grads = random_grads(rng, 1.0);
    set_grads(guarded, grads);
    set_grads(plain, grads);
    const double loss = t == 2 ? std::nan("") : 1.5;
    const Tensor guard = Tensor::full({}, loss, DType::F32).to(Device::CUDA);
    const double guarded_norm = guarded_opt.clip_and_step(1e-2, 1.0, nullptr, {guard})();
    if (t == 2) {
      EXPECT_TRUE(std::isnan(guarded_norm));
      EXPECT_EQ(guarded_opt.step_count(), 1);
      continue;  // the plain optimiser skips this step too, so both stay in step
    }
    const double plain_norm = plain_opt.clip_and_step(1e-2, 1.0)();
    EXPECT_EQ(guarded_norm, plain_norm);
    for (size_t i = 0; i < init.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "param " << i);
      EXPECT_TRUE(same_bits(guarded.vars[i]->value, plain.vars[i]->value));
      EXPECT_TRUE(same_bits(guarded_opt.first_moments()[i], plain_opt.first_moments()[i]));
    }
  }
}

TEST(OptimizerCuda, ClipAndStepAreBitwiseReproducible) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(403);
  const std::vector<Tensor> init = random_init(rng);
  Params a = make_params(init, Device::CUDA), b = make_params(init, Device::CUDA);
  AdamW opt_a(a.refs, kConfig), opt_b(b.refs, kConfig);
  const std::vector<double> norms_a = train(a, opt_a, 77, 0.5);
  const std::vector<double> norms_b = train(b, opt_b, 77, 0.5);
  for (size_t t = 0; t < norms_a.size(); ++t)
    EXPECT_EQ(std::memcmp(&norms_a[t], &norms_b[t], sizeof(double)), 0) << "norm at step " << t + 1;
  for (size_t i = 0; i < init.size(); ++i) {
    EXPECT_TRUE(same_bits(a.vars[i]->value, b.vars[i]->value)) << "param " << i;
    EXPECT_TRUE(same_bits(opt_a.first_moments()[i], opt_b.first_moments()[i])) << "first moment " << i;
    EXPECT_TRUE(same_bits(opt_a.second_moments()[i], opt_b.second_moments()[i])) << "second moment " << i;
  }
}

TEST(OptimizerCuda, LoadStateFromCpuTensorsContinuesIdentically) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(404);
  const std::vector<Tensor> init = random_init(rng);
  Params original = make_params(init, Device::CUDA);
  AdamW opt(original.refs, kConfig);
  train(original, opt, 5, 0.0);
  // A checkpoint: parameters and moments copied to the CPU, as the checkpoint writer does.
  std::vector<Tensor> values, m, v;
  for (size_t i = 0; i < init.size(); ++i) {
    values.push_back(original.vars[i]->value.to(Device::CPU));
    m.push_back(opt.first_moments()[i].to(Device::CPU));
    v.push_back(opt.second_moments()[i].to(Device::CPU));
  }
  Params resumed = make_params(values, Device::CUDA);
  AdamW resumed_opt(resumed.refs, kConfig);
  resumed_opt.load_state(m, v, opt.step_count());
  for (size_t i = 0; i < init.size(); ++i) {
    EXPECT_EQ(resumed_opt.first_moments()[i].device(), Device::CUDA);
    EXPECT_EQ(resumed_opt.second_moments()[i].device(), Device::CUDA);
  }
  const std::vector<double> norms_a = train(original, opt, 6, 0.7);
  const std::vector<double> norms_b = train(resumed, resumed_opt, 6, 0.7);
  EXPECT_EQ(norms_a, norms_b);
  for (size_t i = 0; i < init.size(); ++i) {
    EXPECT_TRUE(same_bits(original.vars[i]->value, resumed.vars[i]->value)) << "param " << i;
    EXPECT_TRUE(same_bits(opt.first_moments()[i], resumed_opt.first_moments()[i])) << "first moment " << i;
  }
  // GPU tensors are accepted too (copied, not aliased).
  std::vector<Tensor> gm, gv;
  for (size_t i = 0; i < init.size(); ++i) {
    gm.push_back(opt.first_moments()[i]);
    gv.push_back(opt.second_moments()[i]);
  }
  resumed_opt.load_state(gm, gv, opt.step_count());
  EXPECT_NE(resumed_opt.first_moments()[0].raw_data(), gm[0].raw_data());
  EXPECT_TRUE(same_bits(resumed_opt.first_moments()[3], gm[3]));
}

// linear's bf16 copy of a weight (Variable::compute_copy): the GPU update writes it along with the weight, so after
// each step it must hold exactly the bits a cast of the updated weight gives (what the next forward would have made),
// for both clip paths, every odd size and the parameter without a gradient (left alone). Where the update covers only
// part of the parameter (a ZeRO-1 range), or the copy does not match the parameter, the copy is dropped instead.
TEST(OptimizerCuda, UpdateKeepsTheBf16ComputeCopyEqualToTheCastWeight) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(406);
  const std::vector<Tensor> init = random_init(rng);
  // Step t: host-scaled step(), or (even t, gradients 100x larger) the device-side clip: two launch paths of one kernel.
  const auto step = [](const Params& params, AdamW& optimizer, Rng& grads_rng, int t) {
    set_grads(params, random_grads(grads_rng, t % 2 ? 1.0 : 100.0));
    if (t % 2)
      optimizer.step(3e-2 / t);
    else
      optimizer.clip_and_step(3e-2 / t, 0.5);
  };
  Params p = make_params(init, Device::CUDA);
  for (const Var& v : p.vars) v->compute_copy = v->value.to(DType::BF16);
  const void* kept = p.vars[4]->compute_copy.raw_data();
  AdamW opt(p.refs, kConfig);
  for (int t = 1; t <= 4; ++t) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    step(p, opt, rng, t);
    for (size_t i = 0; i < init.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "param " << i);
      ASSERT_TRUE(p.vars[i]->compute_copy.defined());
      EXPECT_TRUE(same_bits(p.vars[i]->compute_copy, p.vars[i]->value.to(DType::BF16)));
    }
    // Updated in place: the buffer the model's GEMMs read stays where it was.
    EXPECT_EQ(p.vars[4]->compute_copy.raw_data(), kept);
  }
  EXPECT_TRUE(same_bits(p.vars[kNoGrad]->compute_copy, init[kNoGrad].to(Device::CUDA).to(DType::BF16)));
  // The same steps without copies: the weights themselves do not depend on whether a copy is written.
  Params plain = make_params(init, Device::CUDA);
  AdamW plain_opt(plain.refs, kConfig);
  Rng replay(406);
  random_init(replay);
  for (int t = 1; t <= 4; ++t) step(plain, plain_opt, replay, t);
  for (size_t i = 0; i < init.size(); ++i)
    EXPECT_TRUE(same_bits(plain.vars[i]->value, p.vars[i]->value)) << "param " << i;

  // A ZeRO-1 range (elements [5, 25) of 40 x 25) and a copy of the wrong shape: dropped, not written.
  Var ranged = make_var(init[2].to(Device::CUDA), true, "ranged");
  Var odd = make_var(init[3].to(Device::CUDA), true, "odd");
  ranged->compute_copy = ranged->value.to(DType::BF16);
  odd->compute_copy = Tensor::zeros({7}, DType::BF16, Device::CUDA);
  AdamW partial({{ranged, true, 5, 20}, {odd, true}}, kConfig);
  grad_buffer(ranged).copy_from(random_tensor(rng, kShapes[2], 1.0, DType::F32));
  grad_buffer(odd).copy_from(random_tensor(rng, kShapes[3], 1.0, DType::F32));
  partial.step(1e-2);
  EXPECT_FALSE(ranged->compute_copy.defined());
  EXPECT_FALSE(odd->compute_copy.defined());
}

// A gradient zero_grad gave back that nothing wrote since is a zero gradient to the norm and the update: the same
// bits as a zero-filled one (the GPU twin of AdamW.UnwrittenGradientAfterZeroGradCountsAsZero).
TEST(OptimizerCuda, ReleasedUnwrittenGradientCountsAsZero) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(406);
  const std::vector<Tensor> init = random_init(rng);
  Params released = make_params(init, Device::CUDA), filled = make_params(init, Device::CUDA);
  AdamW opt_released(released.refs, kConfig), opt_filled(filled.refs, kConfig);
  const std::vector<Tensor> grads = random_grads(rng);
  set_grads(released, grads);
  set_grads(filled, grads);
  opt_released.clip_and_step(1e-2, 1.0)();
  opt_filled.clip_and_step(1e-2, 1.0)();
  opt_released.zero_grad();  // step 2: no gradient arrives
  opt_filled.zero_grad();
  for (size_t i = 0; i < init.size(); ++i)
    if (i != kNoGrad) grad_buffer(filled.vars[i]).zero();
  ASSERT_FALSE(released.vars[0]->grad.defined());
  EXPECT_EQ(opt_released.clip_and_step(1e-2, 1.0)(), 0.0);
  EXPECT_EQ(opt_filled.clip_and_step(1e-2, 1.0)(), 0.0);
  for (size_t i = 0; i < init.size(); ++i) {
    EXPECT_TRUE(same_bits(released.vars[i]->value, filled.vars[i]->value)) << "param " << i;
    EXPECT_TRUE(same_bits(opt_released.first_moments()[i], opt_filled.first_moments()[i])) << "param " << i;
    EXPECT_TRUE(same_bits(opt_released.second_moments()[i], opt_filled.second_moments()[i])) << "param " << i;
  }
}

// zero_grad gives GPU gradient buffers back to the allocator (the next forward's activations may use the memory), a
// buffer data parallelism fixed in place excepted; the gradient still counts as zero.
TEST(OptimizerCuda, ZeroGradReleasesBuffersAndRejectsNonFp32) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(405);
  const std::vector<Tensor> init = random_init(rng);
  Params p = make_params(init, Device::CUDA);
  AdamW opt(p.refs, kConfig);
  set_grads(p, random_grads(rng));
  const Tensor fixed_home = Tensor::zeros({kShapes[4][0] * kShapes[4][1] + 8}, DType::F32, Device::CUDA);
  p.vars[4]->grad = fixed_home.flat_view(8, kShapes[4][0] * kShapes[4][1]).reshape(kShapes[4]);
  p.vars[4]->grad.copy_from(random_tensor(rng, kShapes[4], 1.0, DType::F32));
  p.vars[4]->grad_buffer_fixed = true;
  const void* fixed = p.vars[4]->grad.raw_data();
  opt.zero_grad();
  for (size_t i = 0; i < init.size(); ++i) {
    if (i == kNoGrad) continue;
    EXPECT_EQ(p.vars[i]->grad.defined(), i == 4) << "param " << i;
    EXPECT_TRUE(has_gradient(p.vars[i])) << "param " << i;
    EXPECT_TRUE(p.vars[i]->grad_stale) << "param " << i;
    EXPECT_EQ(max_abs(grad_buffer(p.vars[i])), 0.0) << "param " << i;
  }
  EXPECT_EQ(p.vars[4]->grad.raw_data(), fixed);
  EXPECT_FALSE(p.vars[kNoGrad]->grad.defined());
  EXPECT_FALSE(has_gradient(p.vars[kNoGrad]));
  // The next step's first write makes a fresh buffer, to be overwritten; a second write adds to it.
  opt.zero_grad();
  bool accumulate = true;
  EXPECT_TRUE(grad_buffer_for_write(p.vars[3], &accumulate).defined());
  EXPECT_FALSE(accumulate);
  grad_buffer_for_write(p.vars[3], &accumulate);
  EXPECT_TRUE(accumulate);

  Var bf = make_var(Tensor::zeros({3}, DType::BF16, Device::CUDA), true, "bf");
  EXPECT_THROW(AdamW({{bf, true}}, kConfig), Error);
  Var f64 = make_var(Tensor::zeros({3}, DType::F64, Device::CUDA), true, "f64");
  EXPECT_THROW(AdamW({{f64, true}}, kConfig), Error);
  // A gradient on the wrong device is a clear error, not a bad pointer in a kernel.
  Var w = make_var(Tensor::zeros({3}, DType::F32, Device::CUDA), true, "w");
  AdamW opt_w({{w, true}}, kConfig);
  w->grad = Tensor::zeros({3}, DType::F32);
  EXPECT_THROW(opt_w.step(1e-3), Error);
  EXPECT_THROW(clip_grad_norm(opt_w.params(), 1.0), Error);
}

}  // namespace
}  // namespace hgrn
