// DataParallel engine.
#include "runtime/parallel/data_parallel.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>

#include "kernels/gemm.h"
#include "kernels/loss.h"
#include "runtime/core/error.h"
#include "runtime/nn/batch_stat_sync.h"

namespace fanout {

std::vector<int64_t> chunk_sizes(int64_t batch, int parts) {
  FANOUT_CHECK(parts >= 1) << "chunk into " << parts << " parts";
  std::vector<int64_t> out;
  if (batch <= 0) return out;
  const int64_t chunk = (batch + parts - 1) / parts;
  for (int64_t b = 0; b < batch; b += chunk) out.push_back(std::min(chunk, batch - b));
  return out;
}

// SyncBatchNorm: sums (2, C) statistics and element counts over the active replicas.
class DataParallel::StatSync : public BatchStatSync {
 public:
  StatSync(DataParallel& dp) : dp_(dp), calls_(dp.devices_.size(), 0), counts_(kMaxCalls * dp.devices_.size(), 0) {}
  void begin_pass() { std::fill(calls_.begin(), calls_.end(), 0); }
  void all_reduce(int, Tensor& stats, int64_t& count, Context& ctx) override {
    const int rank = rank_of(ctx);
    const int call = calls_[rank]++;
    FANOUT_CHECK(call < kMaxCalls) << "more than " << kMaxCalls << " synchronized BatchNorm calls in one pass";
    const size_t n = dp_.devices_.size();
    counts_[call * n + rank] = count;
    dp_.comm_->all_reduce(rank, stats, ctx);  // its barriers publish counts_ too
    int64_t total = 0;
    for (int r = 0; r < dp_.active_; ++r) total += counts_[call * n + r];
    count = total;
  }

 private:
  static constexpr int kMaxCalls = 4096;
  int rank_of(Context& ctx) const {
    for (size_t i = 0; i < dp_.contexts_.size(); ++i)
      if (dp_.contexts_[i].get() == &ctx) return static_cast<int>(i);
    FANOUT_CHECK(false) << "BatchNorm sync from a context that is not a replica's";
    return -1;
  }
  DataParallel& dp_;
  std::vector<int> calls_;
  std::vector<int64_t> counts_;
};

namespace {
std::unique_ptr<Comm> make_comm(const std::string& kind, const std::vector<Device>& devices, int max_ops) {
  const bool cpu = devices[0].is_cpu();
  if (cpu) {
    FANOUT_USER_CHECK(kind == "auto" || kind == "cpu")
        << "--dp-comm " << kind << " needs CUDA devices; CPU devices use the cpu communicator";
    return make_cpu_comm(static_cast<int>(devices.size()), max_ops);
  }
  std::set<int> distinct;
  for (auto& d : devices) distinct.insert(d.index);
  const bool repeated = distinct.size() != devices.size();
  if (kind == "nccl") {
    FANOUT_USER_CHECK(!repeated) << "--dp-comm nccl needs distinct devices, but the device list repeats a GPU "
                                    "(use --dp-comm p2p)";
    return make_nccl_comm(devices, max_ops);
  }
  if (kind == "p2p") return make_p2p_comm(devices, max_ops);
  FANOUT_USER_CHECK(kind == "auto") << "unknown --dp-comm '" << kind << "' (expected auto, p2p or nccl)";
  return repeated || devices.size() == 1 ? make_p2p_comm(devices, max_ops) : make_nccl_comm(devices, max_ops);
}
}  // namespace

DataParallel::DataParallel(Module& module, const std::vector<Device>& devices, const DataParallelOptions& opts)
    : module_(module), devices_(devices), output_device_(opts.output_device.value_or(devices.at(0))), opts_(opts) {
  FANOUT_USER_CHECK(!devices.empty()) << "DataParallel needs at least one device";
  FANOUT_USER_CHECK(opts.dim == 0) << "DataParallel scatters along dim 0 only, got dim " << opts.dim;
  for (auto& d : devices)
    FANOUT_USER_CHECK(d.kind == devices[0].kind) << "DataParallel cannot mix CPU and CUDA devices";
  FANOUT_USER_CHECK(output_device_.kind == devices[0].kind)
      << "output device " << output_device_.str() << " is not of the replicas' kind";
  FANOUT_USER_CHECK(module.materialized() && module.device().same_memory(devices[0]))
      << "module parameters are on " << (module.materialized() ? module.device().str() : std::string("no device"))
      << " but the primary device is " << devices[0].str();
  apply_split_invariant(module, devices[0], opts.math);
  const int n = static_cast<int>(devices.size());

  // Buckets: contiguous arena ranges of whole parameters, about bucket_bytes each.
  auto params = module.named_parameters();
  std::vector<std::pair<int64_t, int64_t>> spans;  // offset, numel
  for (auto& [name, p] : params) spans.emplace_back(p->offset, p->shape.numel());
  std::sort(spans.begin(), spans.end());
  const int64_t target = std::max<int64_t>(1, static_cast<int64_t>(opts.bucket_bytes / dtype_size(module.grad_dtype())));
  const int64_t arena = module.arenas().params.numel();
  for (size_t i = 0; i < spans.size(); ++i) {
    if (buckets_.empty() || buckets_.back().count >= target) buckets_.push_back({spans[i].first, 0, 0});
    Bucket& b = buckets_.back();
    const int64_t end = i + 1 < spans.size() ? spans[i + 1].first : arena;
    b.count = end - b.begin;
    b.params++;
    param_offsets_.push_back(spans[i].first);
    param_bucket_.push_back(static_cast<int>(buckets_.size()) - 1);
  }
  ready_.assign(n, std::vector<int>(buckets_.size(), 0));
  next_bucket_.assign(n, static_cast<int>(buckets_.size()) - 1);

  if (devices[0].is_cpu()) kernels::set_cpu_blas_threads(cpu_blas_threads(n, opts.math));

  for (int i = 0; i < n; ++i) {
    contexts_.push_back(std::make_unique<Context>(devices[i], opts.seed + 0x9E3779B97F4A7C15ull * (i + 1)));
    contexts_.back()->math = opts.math;
  }
  output_ctx_ = std::make_unique<Context>(output_device_, opts.seed);
  output_ctx_->math = opts.math;
  replicas_.resize(n);
  for (int i = 1; i < n; ++i) replicas_[i] = module.clone(devices[i], &contexts_[i]->compute());
  comm_ = make_comm(opts.comm, devices, static_cast<int>(buckets_.size()) + 1);
  if (opts.sync_bn) {
    stat_sync_ = std::make_unique<StatSync>(*this);
    for (int i = 0; i < n; ++i) replica(i).set_batch_stat_sync(stat_sync_.get());
  }
  for (int i = 0; i < n; ++i)
    contexts_[i]->on_grad_ready = [this, i](size_t b, size_t c) { on_grad_ready(i, b, c); };
  in_chunks_.resize(n);
  out_chunks_.resize(n);
  dy_chunks_.resize(n);
  pool_ = std::make_unique<WorkerPool>(devices, nullptr);
}

DataParallel::~DataParallel() {
  pool_.reset();
  if (stat_sync_) module_.set_batch_stat_sync(nullptr);
  contexts_[0]->on_grad_ready = nullptr;
}

void DataParallel::on_grad_ready(int rank, size_t begin, size_t count) {
  if (!training_forward_) return;
  auto lo = std::lower_bound(param_offsets_.begin(), param_offsets_.end(), static_cast<int64_t>(begin));
  for (auto it = lo; it != param_offsets_.end() && *it < static_cast<int64_t>(begin + count); ++it)
    ++ready_[rank][param_bucket_[it - param_offsets_.begin()]];
  issue_ready_buckets(rank);
}

void DataParallel::issue_ready_buckets(int rank) {
  // Buckets are reduced from the last to the first, each once it is complete:
  // the same order on every rank, whatever order backward finishes them in,
  // as collective libraries (NCCL) require.
  int& next = next_bucket_[rank];
  while (next >= 0 && ready_[rank][next] == buckets_[next].params) {
    Tensor g = replica(rank).arenas().grads.flat(buckets_[next].begin, Shape{buckets_[next].count});
    comm_->reduce_add(next, rank, g, *contexts_[rank]);
    --next;
  }
}

void DataParallel::flush_buckets(int rank) {
  // Buckets holding parameters that got no gradient this pass (unused
  // parameters) are reduced now, in the same order.
  for (size_t b = 0; b < buckets_.size(); ++b) ready_[rank][b] = buckets_[b].params;
  issue_ready_buckets(rank);
}

Tensor DataParallel::forward(const Tensor& x) {
  FANOUT_USER_CHECK(x.dim() >= 1 && x.size(0) >= 1) << "DataParallel forward needs a non-empty batch, got "
                                                     << x.shape().str();
  FANOUT_USER_CHECK(x.device().is_cpu() || x.device() == devices_[0])
      << "input on " << x.device().str() << " must be on the host or on the primary " << devices_[0].str();
  const int n = static_cast<int>(devices_.size());
  sizes_ = chunk_sizes(x.size(0), n);
  active_ = static_cast<int>(sizes_.size());
  if (active_ < n && !warned_small_batch_) {
    std::fprintf(stderr, "fanout: warning: batch of %lld rows runs on %d of %d devices\n",
                 static_cast<long long>(x.size(0)), active_, n);
    warned_small_batch_ = true;
  }
  starts_.assign(active_, 0);
  for (int i = 1; i < active_; ++i) starts_[i] = starts_[i - 1] + sizes_[i - 1];
  training_forward_ = module_.is_training();
  comm_->begin(active_);
  if (stat_sync_) stat_sync_->begin_pass();
  for (auto& r : ready_) std::fill(r.begin(), r.end(), 0);
  std::fill(next_bucket_.begin(), next_bucket_.end(), static_cast<int>(buckets_.size()) - 1);

  // One sample's input shape (dim 0 set to 1) keys the known output shape.
  Shape sample_in = x.shape();
  sample_in[0] = 1;
  const bool fused = sample_out_known_ && sample_in == sample_in_;
  if (fused) {
    Shape gs = sample_out_;
    gs[0] = x.size(0);
    ensure(gathered_, gs, DType::F32, output_device_);
  }
  out_shapes_.resize(n);
  auto gather = [&](int i) {
    Tensor dst = gathered_.slice(starts_[i], starts_[i] + sizes_[i]);
    dst.copy_from(out_chunks_[i], &contexts_[i]->compute());
    contexts_[i]->compute().synchronize();
  };
  pool_->run(
      [&](int i) {
        Context& ctx = *contexts_[i];
        Module& m = replica(i);
        try {
          // Replicate: parameters and buffers from the primary.
          comm_->broadcast(i, m.arenas().params, ctx);
          comm_->broadcast(i, m.arenas().buffers, ctx);
          m.train(training_forward_);
          ctx.training = training_forward_;
          if (i > 0 && training_forward_) m.zero_grad(&ctx.compute());
          Tensor chunk = x.slice(starts_[i], starts_[i] + sizes_[i]);
          if (chunk.device().same_memory(devices_[i])) {
            in_chunks_[i] = chunk;
          } else {
            ensure(in_chunks_[i], chunk.shape(), chunk.dtype(), devices_[i]);
            in_chunks_[i].copy_from(chunk, &ctx.compute());
          }
          out_chunks_[i] = m.forward(in_chunks_[i], ctx);
          out_shapes_[i] = out_chunks_[i].shape();
          if (fused) {
            FANOUT_CHECK(out_shapes_[i][0] == sizes_[i] && out_shapes_[i].numel() / sizes_[i] == sample_out_.numel())
                << "replica " << i << " output " << out_shapes_[i].str() << " differs from the expected per-sample "
                << sample_out_.str();
            gather(i);
          }
        } catch (...) {
          comm_->abort();
          throw;
        }
      },
      active_);

  if (!fused) {
    // First batch of this input shape: learn the output shape, gather in a second round.
    Shape gs = out_shapes_[0];
    gs[0] = x.size(0);
    ensure(gathered_, gs, DType::F32, output_device_);
    pool_->run(gather, active_);
    sample_in_ = sample_in;
    sample_out_ = out_shapes_[0];
    sample_out_[0] = 1;
    sample_out_known_ = true;
  }
  return gathered_;
}

void DataParallel::backward(const Tensor& dy) {
  FANOUT_CHECK(training_forward_) << "DataParallel backward after an eval-mode forward";
  FANOUT_USER_CHECK(dy.shape() == gathered_.shape())
      << "output gradient " << dy.shape().str() << " does not match the output " << gathered_.shape().str();
  if (stat_sync_) stat_sync_->begin_pass();
  pool_->run(
      [&](int i) {
        Context& ctx = *contexts_[i];
        try {
          Tensor chunk = dy.slice(starts_[i], starts_[i] + sizes_[i]);
          if (chunk.device().same_memory(devices_[i])) {
            dy_chunks_[i] = chunk;
          } else {
            ensure(dy_chunks_[i], chunk.shape(), DType::F32, devices_[i]);
            dy_chunks_[i].copy_from(chunk, &ctx.compute());
          }
          replica(i).backward(dy_chunks_[i], ctx);
          flush_buckets(i);
          comm_->finish(i, ctx);
        } catch (...) {
          comm_->abort();
          throw;
        }
      },
      active_);
}

namespace {
// The engine owns training: the model moves to the primary and needs no dx.
Module& on_primary(Module& m, Device primary) {
  m.to(primary);
  m.set_input_grad(false);
  return m;
}
}  // namespace

DataParallelEngine::DataParallelEngine(Module& model, const std::vector<Device>& devices,
                                       const kernels::SgdHyper& sgd, const LossOptions& loss,
                                       const DataParallelOptions& opts)
    : dp_(on_primary(model, devices.at(0)), devices, opts), loss_(loss) {
  sgd_ = std::make_unique<optim::SGD>(model, sgd);
  loss_h_ = Tensor::empty(Shape{1});
  correct_h_ = Tensor::empty(Shape{1}, DType::I32);
}

StepResult DataParallelEngine::loss_step(const Tensor& x, const Tensor& y, bool train) {
  dp_.module().train(train);
  Tensor logits = dp_.forward(x);
  Context& octx = dp_.output_context();
  const Device d = dp_.output_device();
  const Tensor* yin = &y;
  if (!d.is_cpu()) {
    ensure(yd_, y.shape(), DType::I32, d);
    yd_.copy_from(y, &octx.compute());
    yin = &yd_;
  }
  ensure(probs_, logits.shape(), d);
  ensure(loss_t_, Shape{1}, d);
  ensure(correct_t_, Shape{1}, DType::I32, d);
  kernels::softmax_xent_forward(octx, logits, *yin, loss_.label_smoothing, probs_, loss_t_);
  kernels::count_correct(octx, logits, *yin, correct_t_);
  if (train) {
    ensure(dlogits_, logits.shape(), d);
    kernels::softmax_xent_backward(octx, probs_, *yin, loss_.label_smoothing, 1.0f / static_cast<float>(x.size(0)),
                                   dlogits_);
    octx.compute().synchronize();
    dp_.backward(dlogits_);
  }
  loss_h_.copy_from(loss_t_, &octx.compute());
  correct_h_.copy_from(correct_t_, &octx.compute());
  octx.compute().synchronize();
  return {static_cast<double>(loss_h_.f32()[0]) * x.size(0), correct_h_.data<int32_t>()[0], x.size(0)};
}

StepResult DataParallelEngine::train_step(const Tensor& x, const Tensor& y, float lr) {
  StepResult r = loss_step(x, y, true);
  Context& pctx = dp_.primary_context();
  sgd_->set_lr(lr);
  sgd_->step(pctx);
  sgd_->zero_grad(pctx);
  pctx.compute().synchronize();
  return r;
}

StepResult DataParallelEngine::eval_step(const Tensor& x, const Tensor& y) { return loss_step(x, y, false); }

}  // namespace fanout
