// data_parallel.cpp: the flat-buffer layout, the per-bucket reductions during the backward, ZeRO-1's shares and
// the gathering of sharded optimiser state for checkpoints (see data_parallel.h).
#include "dist/data_parallel.h"

#include <algorithm>
#include <map>

#include "dist/world.h"

namespace hgrn {

namespace {
// Every parameter starts, and every rank's share of a bucket starts and ends, on a multiple of 64 elements
// (256 bytes): aligned for vector loads and for NCCL.
constexpr int64_t kAlignment = 64;

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }
}  // namespace

std::string describe(const DataParallelOptions& options) {
  std::string text = options.zero1 ? "ZeRO-1" : "";
  if (options.reduce_dtype != DType::F32)
    text += std::string(text.empty() ? "" : ", ") + "gradients summed in " + dtype_name(options.reduce_dtype);
  if (!options.overlap) text += std::string(text.empty() ? "" : ", ") + "reduced after the backward";
  return text;
}

DataParallel::DataParallel(CausalLM& model, std::vector<ParamRef> params, const DataParallelOptions& options)
    : model_(model), options_(options), params_(std::move(params)) {
  const World& w = world();
  const Device device = model.device();
  collectives_ = make_collectives(device);

  // Which optimiser parameter each model Var is, then the layout: the groups in backward order, one bucket each.
  std::map<const Variable*, size_t> index_of;
  for (size_t i = 0; i < params_.size(); ++i) {
    HGRN_CHECK(params_[i].count < 0, "DataParallel: parameter '", params_[i].param->name, "' already has a range");
    HGRN_CHECK(params_[i].param->value.dtype() == DType::F32, "DataParallel: parameter '", params_[i].param->name,
               "' is ", dtype_name(params_[i].param->value.dtype()), "; data parallelism reduces fp32 gradients");
    HGRN_CHECK(index_of.emplace(params_[i].param.get(), i).second, "DataParallel: parameter '",
               params_[i].param->name, "' listed twice");
  }
  placements_.resize(params_.size());
  std::vector<bool> placed(params_.size(), false);
  int64_t offset = 0;
  for (const std::vector<Var>& group : model.gradient_ready_groups()) {
    Bucket bucket;
    bucket.offset = offset;
    for (const Var& var : group) {
      auto it = index_of.find(var.get());
      HGRN_CHECK(it != index_of.end(), "DataParallel: model parameter '", var->name, "' is not optimised");
      HGRN_CHECK(!placed[it->second], "DataParallel: model parameter '", var->name, "' is in two gradient groups");
      placed[it->second] = true;
      placements_[it->second] = {offset, var->value.numel(), buckets_.size()};
      offset += round_up(var->value.numel(), kAlignment);
    }
    bucket.size = round_up(offset - bucket.offset, kAlignment * w.size);
    offset = bucket.offset + bucket.size;
    buckets_.push_back(bucket);
  }
  for (size_t i = 0; i < params_.size(); ++i)
    HGRN_CHECK(placed[i], "DataParallel: parameter '", params_[i].param->name, "' is in no gradient group");

  // The parameters move into the flat buffer; the gradients start there as zeros (padding stays zero for good).
  flat_params_ = Tensor::zeros({offset}, DType::F32, device);
  flat_grads_ = Tensor::zeros({offset}, DType::F32, device);
  if (options_.reduce_dtype != DType::F32) reduce_buffer_ = Tensor::zeros({offset}, options_.reduce_dtype, device);
  for (size_t i = 0; i < params_.size(); ++i) {
    Variable& var = *params_[i].param;
    const Placement& p = placements_[i];
    Tensor value = flat_params_.flat_view(p.offset, p.numel).reshape(var.value.shape());
    value.copy_from(var.value);
    var.value = value;
    var.grad = flat_grads_.flat_view(p.offset, p.numel).reshape(var.value.shape());
    var.grad_buffer_fixed = true;
    var.invalidate_compute_copy();
  }
  rank_params_ = options_.zero1 ? params_of_rank(w.rank) : params_;
  queued_.assign(buckets_.size(), false);
  gathering_.assign(buckets_.size(), false);
  model_.set_gradient_ready_hook([this](size_t group) { on_gradients_ready(group); });
  model_.set_parameters_needed_hook([this](size_t group) { on_parameters_needed(group); });
}

DataParallel::~DataParallel() {
  model_.set_gradient_ready_hook(nullptr);
  model_.set_parameters_needed_hook(nullptr);
  try {
    wait_for_weights();  // the buffers must outlive the all-gathers writing them
  } catch (const Error&) {  // a failed collective already aborted the communicator: nothing is left running
  }
}

std::vector<ParamRef> DataParallel::params_of_rank(int rank) const {
  std::vector<ParamRef> refs = params_;
  for (size_t i = 0; i < refs.size(); ++i) {
    const Placement& p = placements_[i];
    const Bucket& b = buckets_[p.bucket];
    const int64_t share = b.size / world().size;
    const int64_t lo = std::max(p.offset, b.offset + rank * share);
    const int64_t hi = std::min(p.offset + p.numel, b.offset + (rank + 1) * share);
    refs[i].begin = hi > lo ? lo - p.offset : 0;
    refs[i].count = std::max<int64_t>(hi - lo, 0);
  }
  return refs;
}

void DataParallel::reduce_in_next_backward(bool reduce) {
  reduce_ = reduce;
  std::fill(queued_.begin(), queued_.end(), false);
  reduced_ = 0;
}

void DataParallel::on_gradients_ready(size_t group) {
  if (!reduce_) return;
  HGRN_CHECK(group < buckets_.size() && !queued_[group], "DataParallel: gradient group ", group,
             " reported complete twice or out of range");
  queued_[group] = true;
  // A gradient that this backward never wrote still holds last step's values (AdamW::zero_grad is lazy).
  for (size_t i = 0; i < params_.size(); ++i)
    if (placements_[i].bucket == group) settle_grad(params_[i].param);
  if (options_.overlap) reduce_bucket(group);
}

void DataParallel::reduce_bucket(size_t bucket) {
  const Bucket& b = buckets_[bucket];
  if (b.size == 0) return;
  Tensor grads = flat_grads_.flat_view(b.offset, b.size);
  if (reduce_buffer_.defined()) {
    Tensor rounded = reduce_buffer_.flat_view(b.offset, b.size);
    rounded.copy_from(grads);
    grads = rounded;
  }
  collectives_->stamp(2 * reduced_, Collectives::Stream::Compute);
  collectives_->after_compute();
  if (options_.zero1)
    collectives_->reduce_scatter_sum(grads.raw_data(), b.size / world().size, grads.dtype());
  else
    collectives_->all_reduce_sum(grads.raw_data(), b.size, grads.dtype());
  collectives_->stamp(2 * reduced_ + 1, Collectives::Stream::Collectives);
  ++reduced_;
}

void DataParallel::finish_gradient_reduction() {
  HGRN_CHECK(reduce_, "DataParallel: finish_gradient_reduction without reduce_in_next_backward(true)");
  for (size_t g = 0; g < queued_.size(); ++g)
    HGRN_CHECK(queued_[g], "DataParallel: the backward never reported the gradients of group ", g,
               " complete, so they were not reduced (a model change that forgot its gradient-ready marker?)");
  if (!options_.overlap)  // the same reductions in the same order, queued only now
    for (size_t g = 0; g < buckets_.size(); ++g) reduce_bucket(g);
  collectives_->wait("gradient reduction");
  last_reduced_ = reduced_;  // their stamps stay until the next backward: last_reduction_timing reads them
  std::fill(gathering_.begin(), gathering_.end(), false);  // queued before the reductions, so complete too
  if (reduce_buffer_.defined())  // the sums back into the fp32 gradients: this rank's shares, or whole buckets
    for (const Bucket& b : buckets_) {
      const int64_t share = options_.zero1 ? b.size / world().size : b.size;
      const int64_t at = b.offset + (options_.zero1 ? world().rank * share : 0);
      if (share > 0) flat_grads_.flat_view(at, share).copy_from(reduce_buffer_.flat_view(at, share));
    }
  reduce_in_next_backward(false);
}

DataParallel::ReductionTiming DataParallel::last_reduction_timing() {
  // Stamp 2k: bucket k (in the order queued) complete on the compute stream; 2k + 1: its reduction complete. The
  // communication stream works on bucket k from the later of its stamp 2k and stamp 2k - 1.
  ReductionTiming timing{static_cast<int64_t>(last_reduced_), 0, 0};
  for (size_t k = 0; k < last_reduced_; ++k) {
    const double ready = collectives_->stamp_ms(0, 2 * k), done = collectives_->stamp_ms(0, 2 * k + 1);
    const double start = k == 0 ? ready : std::max(ready, collectives_->stamp_ms(0, 2 * k - 1));
    timing.busy_ms += std::max(done - start, 0.0);
    if (k + 1 == last_reduced_) timing.tail_ms = std::max(done - ready, 0.0);
  }
  return timing;
}

std::function<double(double)> DataParallel::grad_norm_total() const {
  if (!options_.zero1) return nullptr;
  return [](double mine) { return sum_in_rank_order(mine); };
}

void DataParallel::finish_update() {
  if (!options_.zero1) return;
  collectives_->after_compute();
  // Forward order: the last bucket (the embedding) first. An all-gather only copies, so its order changes no bits.
  for (size_t g = buckets_.size(); g-- > 0;) {
    const Bucket& b = buckets_[g];
    if (b.size == 0) continue;
    collectives_->all_gather(flat_params_.data<float>() + b.offset, b.size / world().size);
    collectives_->record_mark(g);
    gathering_[g] = true;
  }
  // The bf16 copies are made again from the gathered weights, at the first read after the wait.
  for (const ParamRef& ref : params_) ref.param->invalidate_compute_copy();
}

// A wait on the host, not the compute stream's on an event: kernels reading the bucket are queued only after it is
// complete, so that every wait on a hung peer happens here, inside the watchdog's PeerWait.
void DataParallel::on_parameters_needed(size_t group) {
  if (group >= gathering_.size() || !gathering_[group]) return;
  collectives_->wait_mark(group, "weight all-gather");
  gathering_[group] = false;
}

void DataParallel::wait_for_weights() {
  if (std::find(gathering_.begin(), gathering_.end(), true) == gathering_.end()) return;
  collectives_->wait("weight all-gather");
  std::fill(gathering_.begin(), gathering_.end(), false);
}

void DataParallel::all_reduce_max(float* data, int64_t count, const char* what) {
  if (count <= 0) return;
  collectives_->after_compute();
  collectives_->all_reduce_max(data, count);
  collectives_->wait(what);
}

void DataParallel::gather_moments(const AdamW& optimizer, std::vector<Tensor>* first,
                                  std::vector<Tensor>* second) const {
  HGRN_CHECK(options_.zero1, "DataParallel::gather_moments: without ZeRO-1 every rank holds the whole moments");
  first->clear();
  second->clear();
  // Each rank sends its shares, all first moments then all second ones in parameter order; rank 0 knows every
  // rank's ranges from the layout and puts the pieces back in place.
  std::vector<float> mine;
  for (const std::vector<Tensor>* moments : {&optimizer.first_moments(), &optimizer.second_moments()})
    for (const Tensor& m : *moments) {
      const Tensor host = on_device(m, Device::CPU);
      mine.insert(mine.end(), host.data<float>(), host.data<float>() + host.numel());
    }
  const std::vector<float> all = gather_to_root(mine);
  if (!world().is_root()) return;
  for (const ParamRef& ref : params_) {
    first->push_back(Tensor::zeros(ref.param->value.shape(), DType::F32));
    second->push_back(Tensor::zeros(ref.param->value.shape(), DType::F32));
  }
  size_t at = 0;
  for (int r = 0; r < world().size; ++r) {
    const std::vector<ParamRef> refs = params_of_rank(r);
    for (std::vector<Tensor>* moments : {first, second})
      for (size_t i = 0; i < refs.size(); ++i) {
        std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(at), refs[i].count,
                    (*moments)[i].data<float>() + refs[i].begin);
        at += static_cast<size_t>(refs[i].count);
      }
  }
  HGRN_CHECK(at == all.size(), "DataParallel: gathered ", all.size(), " moment values, the layout accounts for ", at);
}

}  // namespace hgrn
