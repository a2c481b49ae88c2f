// DataParallel engine.
#include "runtime/parallel/data_parallel.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <mutex>
#include <set>

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

// SyncBatchNorm: sums (2, C) statistics and the element count over the
// active replicas in one all-reduce (count packed after the statistics, so
// no rank reads another's count before it is written), then, with process
// group hooks, over processes: the primary sums across processes and
// broadcasts the result to the other local replicas.
class DataParallel::StatSync : public BatchStatSync {
 public:
  explicit StatSync(DataParallel& dp) : dp_(dp), packed_(dp.devices_.size()), count_host_(dp.devices_.size()) {}
  // The count travels in the statistics' own dtype as two numbers, count /
  // 2^12 and count % 2^12, each summed exactly (float32 holds integers
  // below 2^24): exact up to 2^36 elements per channel over every replica
  // and process (float32 once counted only to 2^24: 8 volumes of 128^3).
  static constexpr int64_t kSplit = int64_t{1} << 12;
  static constexpr int64_t kMaxCount = int64_t{1} << 36;
  void all_reduce(int, Tensor& stats, int64_t& count, Context& ctx) override {
    const int rank = rank_of(ctx);
    const DType dt = stats.dtype();
    FANOUT_CHECK(dt == DType::F32 || dt == DType::F64) << "SyncBatchNorm: statistics of " << dtype_name(dt);
    FANOUT_CHECK(count >= 0 && count < kMaxCount)
        << "SyncBatchNorm: " << count << " elements per channel cannot be counted exactly";
    Tensor& p = packed_[rank][dt == DType::F64];
    const int64_t n = stats.numel();
    ensure(p, Shape{n + 2}, dt, ctx.device());
    Tensor head = p.flat(0, Shape{n});
    Tensor tail = p.flat(n, Shape{2});
    // Reused (nothing is allocated per layer and step) and, for GPUs,
    // page-locked, so that the count's copies are truly asynchronous.
    Tensor& h = count_host_[rank][dt == DType::F64];
    if (!h.defined()) h = ctx.device().is_cuda() ? Tensor::empty_pinned(Shape{2}, dt) : Tensor::empty(Shape{2}, dt);
    const int64_t hi = count / kSplit, lo = count % kSplit;
    if (dt == DType::F32) {
      h.f32()[0] = static_cast<float>(hi);
      h.f32()[1] = static_cast<float>(lo);
    } else {
      h.f64()[0] = static_cast<double>(hi);
      h.f64()[1] = static_cast<double>(lo);
    }
    head.copy_from(stats.view(Shape{n}), &ctx.compute());
    tail.copy_from(h, &ctx.compute());
    dp_.comm_->all_reduce(rank, p, ctx);
    if (ProcessLink* link = dp_.process_link()) {  // across processes: the primary's sum, then to the replicas
      if (rank == 0) link->all_reduce(p, "all-reduce of SyncBatchNorm statistics", kTagMain);
      dp_.comm_->broadcast(rank, p, ctx);
    }
    stats.view(Shape{n}).copy_from(head, &ctx.compute());
    h.copy_from(tail, &ctx.compute());
    ctx.compute().synchronize();
    const double sum_hi = dt == DType::F32 ? h.f32()[0] : h.f64()[0];
    const double sum_lo = dt == DType::F32 ? h.f32()[1] : h.f64()[1];
    FANOUT_CHECK(sum_hi < 16777216.0 && sum_lo < 16777216.0)
        << "SyncBatchNorm: the elements per channel over every replica cannot be counted exactly";
    count = static_cast<int64_t>(sum_hi) * kSplit + static_cast<int64_t>(sum_lo);
  }

 private:
  int rank_of(Context& ctx) const {
    for (size_t i = 0; i < dp_.contexts_.size(); ++i)
      if (dp_.contexts_[i].get() == &ctx) return static_cast<int>(i);
    FANOUT_CHECK(false) << "BatchNorm sync from a context that is not a replica's";
    return -1;
  }
  DataParallel& dp_;
  // [rank][float64?]: the statistics and the count, packed; the count on the host.
  std::vector<std::array<Tensor, 2>> packed_, count_host_;
};

namespace {
std::unique_ptr<Comm> make_comm(const std::string& kind, const std::vector<Device>& devices, int max_ops) {
  const bool cpu = devices[0].is_cpu();
  FANOUT_USER_CHECK(kind == "auto" || kind == "cpu" || kind == "p2p" || kind == "nccl")
      << "unknown communicator '" << kind << "' (expected auto, cpu, p2p or nccl)";
  if (cpu) {
    FANOUT_USER_CHECK(kind == "auto" || kind == "cpu")
        << "the " << kind << " communicator needs CUDA devices; CPU devices use the cpu communicator";
    return make_cpu_comm(static_cast<int>(devices.size()), max_ops);
  }
  std::set<int> distinct;
  for (auto& d : devices) distinct.insert(d.index);
  const bool repeated = distinct.size() != devices.size();
  if (kind == "nccl") {
    FANOUT_USER_CHECK(!repeated) << "the nccl communicator needs distinct devices, but the device list repeats a GPU "
                                    "(use the p2p communicator)";
    return make_nccl_comm(devices, max_ops);
  }
  if (kind == "p2p") return make_p2p_comm(devices, max_ops);
  FANOUT_USER_CHECK(kind == "auto") << "unknown communicator '" << kind << "' (expected auto, p2p or nccl)";
  return repeated || devices.size() == 1 ? make_p2p_comm(devices, max_ops) : make_nccl_comm(devices, max_ops);
}
}  // namespace

namespace {
// Checks the arguments of DataParallel and prepares the module (split-invariant math).
Module& checked(Module& module, const std::vector<Device>& devices, const DataParallelOptions& opts) {
  FANOUT_USER_CHECK(!devices.empty()) << "DataParallel needs at least one device";
  FANOUT_USER_CHECK(opts.dim == 0) << "DataParallel scatters along dim 0 only, got dim " << opts.dim;
  for (auto& d : devices)
    FANOUT_USER_CHECK(d.kind == devices[0].kind) << "DataParallel cannot mix CPU and CUDA devices";
  const Device out = opts.output_device.value_or(devices[0]);
  FANOUT_USER_CHECK(out.kind == devices[0].kind) << "output device " << out.str() << " is not of the replicas' kind";
  // CPU devices are the replicas' names for one memory: another name is no device.
  FANOUT_USER_CHECK(out.is_cuda() || std::find(devices.begin(), devices.end(), out) != devices.end())
      << "output device " << out.str() << " is not one of the replicas' devices";
  FANOUT_USER_CHECK(module.materialized() && module.device().same_memory(devices[0]))
      << "module parameters are on " << (module.materialized() ? module.device().str() : std::string("no device"))
      << " but the primary device is " << devices[0].str();
  apply_split_invariant(module, devices[0], opts.math);
  return module;
}
}  // namespace

DataParallel::DataParallel(Module& module, const std::vector<Device>& devices, const DataParallelOptions& opts)
    : module_(checked(module, devices, opts)),
      devices_(devices),
      output_device_(opts.output_device.value_or(devices.at(0))),
      opts_(opts),
      layout_(module, opts.bucket_bytes) {
  const int n = static_cast<int>(devices.size());
  if (auto it = std::find(devices.begin(), devices.end(), output_device_); it != devices.end())
    output_replica_ = static_cast<int>(it - devices.begin());
  opts_.math = with_cpu_threads(opts.math, n);  // DDP has set it for its processes already

  for (int i = 0; i < n; ++i) {
    contexts_.push_back(std::make_unique<Context>(devices[i], opts.seed + 0x9E3779B97F4A7C15ull * (i + 1)));
    contexts_.back()->math = opts_.math;
  }
  output_ctx_ = std::make_unique<Context>(output_device_, opts.seed);
  output_ctx_->math = opts_.math;
  if (devices[0].is_cpu() && n > 1) {
    step_ctx_ = std::make_unique<Context>(devices[0], opts.seed);
    step_ctx_->math = opts_.math;
    step_ctx_->math.cpu_threads = opts_.math.cpu_threads * n;
    // On the replicas' threads, idle while the optimizer steps: a team of the primary's own would stay
    // awake (OpenMP's spin) beside the replicas' next forward.
    // A second caller meanwhile (another thread's step, a kernel inside one) runs its shares here, in turn.
    step_ctx_->cpu_workers = [this](const std::function<void(int)>& fn) {
      std::unique_lock<std::mutex> own(step_workers_mu_, std::try_to_lock);
      if (!own) {
        for (int k = 0; k < pool_->size(); ++k) fn(k);
        return;
      }
      pool_->run(fn, pool_->size());
    };
    step_ctx_->cpu_worker_count = n;
  }
  replicas_.resize(n);
  for (int i = 1; i < n; ++i) replicas_[i] = module.clone(devices[i], &contexts_[i]->compute());
  // CPU replicas read the primary's parameters in place: no copy per pass, no second copy in memory.
  params_shared_ = devices[0].is_cpu();
  for (int i = 1; i < n && params_shared_; ++i) replicas_[i]->share_params(module);
  const int world = opts.group ? opts.group->size() : 1, rank = opts.group ? opts.group->rank() : 0;
  // A bucket cut by shards is one op per piece.
  comm_ = make_comm(opts.comm, devices, layout_.size() + world * n + 1);
  const ShardPlan plan =
      opts.shard_optimizer || opts.shard_grads
          ? ShardPlan(opts.shard_grads ? ShardMode::Grads : ShardMode::State, module.arenas().params.numel(), n,
                      world, rank)
          : ShardPlan();
  if (plan.mode() == ShardMode::Grads)
    for (int i = 0; i < n; ++i) {
      const auto [b, e] = bucket_hull(layout_, plan.local(i));
      replica(i).set_grad_window(b, e);
    }
  std::vector<Module*> ms;
  std::vector<Context*> cs;
  for (int i = 0; i < n; ++i) {
    ms.push_back(&replica(i));
    cs.push_back(contexts_[i].get());
  }
  reducer_ = std::make_unique<Reducer>(ms, cs, *comm_, layout_, ReducerOptions{opts.group, opts.grad_reduce_dtype, plan});
  if (!plan.empty())
    // One process (DDP of world size 1) shards among its replicas alone.
    sharding_ = std::make_unique<Sharding>(plan, ms, cs, world > 1 ? reducer_->link() : nullptr,
                                           [this](const std::function<void(int)>& fn) {
      pool_->run(fn, static_cast<int>(devices_.size()));
    });
  if (opts.sync_bn) {
    stat_sync_ = std::make_unique<StatSync>(*this);
    for (int i = 0; i < n; ++i) replica(i).set_batch_stat_sync(stat_sync_.get());
  }
  for (int i = 0; i < n; ++i) {
    contexts_[i]->on_grad_ready = [this, i](size_t b, size_t c) { reducer_->grad_ready(i, b, c); };
    if (plan.mode() == ShardMode::Grads)
      contexts_[i]->on_grad_write = [this, i](size_t b, size_t c) { reducer_->grad_write(i, b, c); };
  }
  const std::string unsupported =
      opts.sync_bn       ? "SyncBatchNorm all-reduces its statistics inside the forward"
      : opts.shard_grads ? "gradients in flight (ZeRO-2) take memory as backward writes them"
                         : "";
  for (int i = 0; i < n; ++i)
    graphs_.push_back(std::make_unique<StepGraphs>(opts.cuda_graphs, devices[i], unsupported));
  in_chunks_.resize(n);
  graph_in_.resize(n);
  out_chunks_.resize(n);
  dy_chunks_.resize(n);
  pool_ = std::make_unique<WorkerPool>(devices, [devs = devices](int i) { bind_thread_to(devs[i]); });
}

DataParallel::~DataParallel() {
  pool_.reset();
  // The module may meanwhile serve another engine: detach only our own hook.
  if (stat_sync_ && module_.batch_stat_sync() == stat_sync_.get()) module_.set_batch_stat_sync(nullptr);
}

DType parse_grad_reduce_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  throw Error("gradients cannot be reduced in '" + s + "' (expected fp32 or bf16)");
}

void DataParallel::run_replicas(const std::function<void(int)>& fn) {
  try {
    pool_->run(
        [&](int i) {
          try {
            fn(i);
          } catch (const Error& e) {
            comm_->abort();
            reducer_->abort();  // replicas waiting on this one's buckets
            if (active_ == 1) throw;
            // In the user's terms: which rows of which batch the replica held.
            throw Error(std::string(e.what()) + " (replica " + std::to_string(i) + " of " + std::to_string(active_) +
                        ": batch rows " + std::to_string(starts_[i]) + ".." +
                        std::to_string(starts_[i] + sizes_[i] - 1) + " of the batch " + batch_shape_.str() + ")");
          } catch (...) {
            comm_->abort();
            reducer_->abort();
            throw;
          }
        },
        active_);
  } catch (...) {
    reducer_->abort();
    throw;
  }
}

void DataParallel::begin_pass(const Tensor& x) {
  FANOUT_USER_CHECK(x.dim() >= 1 && x.size(0) >= 1) << "DataParallel forward needs a non-empty batch, got "
                                                     << x.shape().str();
  FANOUT_USER_CHECK(x.device().is_cpu() || x.device() == devices_[0])
      << "input on " << x.device().str() << " must be on the host or on the primary " << devices_[0].str();
  const int n = static_cast<int>(devices_.size());
  sizes_ = chunk_sizes(x.size(0), n);
  active_ = static_cast<int>(sizes_.size());
  if (active_ < n && !warned_small_batch_) {
    std::fprintf(stderr, "fanout: warning: a%s batch of %lld row%s runs on %d of %d devices (torch.chunk's split)\n",
                 module_.is_training() ? "" : "n evaluation", static_cast<long long>(x.size(0)),
                 x.size(0) == 1 ? "" : "s", active_, n);
    warned_small_batch_ = true;
  }
  starts_.assign(active_, 0);
  for (int i = 1; i < active_; ++i) starts_[i] = starts_[i - 1] + sizes_[i - 1];
  batch_shape_ = x.shape();
  for (int i = 0; i < active_; ++i) contexts_[i]->first_row = starts_[i];
  if (module_.is_training()) {
    // Every replica draws from the pass's key at its rows of the whole
    // batch. DDP rank r's row n is row n * world + r, as DistributedSampler
    // deals an epoch's samples (r, r + world, ...; equal batches), so a
    // run draws what one device's run of the whole batch draws.
    const int64_t rank = opts_.group ? opts_.group->rank() : 0, world = opts_.group ? opts_.group->size() : 1;
    const uint64_t key = pass_key(opts_.seed, pass_++);
    for (int i = 0; i < active_; ++i) {
      contexts_[i]->pass_key = key;
      contexts_[i]->random_row = starts_[i] * world + rank;
      contexts_[i]->random_row_stride = world;
    }
  }
  training_forward_ = module_.is_training();
  gathered_pass_ = false;
  comm_->begin(active_);
  // Reinstalled every pass: another engine built on this module may have replaced it.
  if (stat_sync_) module_.set_batch_stat_sync(stat_sync_.get());
  reducer_->begin(active_, training_forward_, sync_);
  out_shapes_.resize(n);
}

void DataParallel::prepare_replica(int i, const Tensor& x, bool stable) {
  Context& ctx = *contexts_[i];
  Module& m = replica(i);
  // Replicate: parameters (shared on CPU devices; bound again if the primary's arena was replaced) and
  // buffers from the primary.
  if (!params_shared_) comm_->broadcast(i, m.arenas().params, ctx);
  else if (i > 0 && !m.shares_params_with(module_)) m.share_params(module_);
  comm_->broadcast(i, m.arenas().buffers, ctx);
  m.train(training_forward_);
  ctx.training = training_forward_;
  if (training_forward_ && sharding_) {
    sharding_->prepare_grads(i);
  } else if (i > 0 && training_forward_) {
    m.zero_grad(&ctx.compute());
  }
  Tensor chunk = x.slice(starts_[i], starts_[i] + sizes_[i]);
  if (stable) {
    // A buffer of the replica's own (in_chunks_ may be a view of a caller's tensor).
    ensure(graph_in_[i], chunk.shape(), chunk.dtype(), devices_[i], chunk.format());
    graph_in_[i].copy_from(chunk, &ctx.compute());
    in_chunks_[i] = graph_in_[i];
  } else if (chunk.device().same_memory(devices_[i])) {
    in_chunks_[i] = chunk;
  } else {
    if (in_chunks_[i].defined() && graph_in_[i].defined() && in_chunks_[i].raw() == graph_in_[i].raw())
      in_chunks_[i] = Tensor();  // the graph's buffer stays the graph's
    ensure(in_chunks_[i], chunk.shape(), chunk.dtype(), devices_[i]);
    in_chunks_[i].copy_from(chunk, &ctx.compute());
  }
}

Tensor DataParallel::replica_forward(int i, const Tensor& x) {
  prepare_replica(i, x, false);
  out_chunks_[i] = replica(i).forward(in_chunks_[i], *contexts_[i]);
  out_shapes_[i] = out_chunks_[i].shape();
  return out_chunks_[i];
}

void DataParallel::replica_backward(int i, const Tensor& dy) {
  Module::backward_of(replica(i), "model", dy, *contexts_[i]);
  finish_backward(i);
}

void DataParallel::finish_backward(int i) {
  Context& ctx = *contexts_[i];
  if (opts_.require_all_grads) {
    const auto missing = reducer_->unready(i);
    if (!missing.empty()) {
      std::string names;
      for (auto& m : missing) names += (names.empty() ? "" : ", ") + m;
      FANOUT_FAIL() << "parameters that produced no gradient in this step: " << names
                    << " (every parameter must take part in the loss under DDP)";
    }
  }
  reducer_->flush(i);
  comm_->finish(i, ctx);
}

GraphStats DataParallel::graph_stats() const {
  GraphStats s = graphs_[0]->stats();
  for (auto& g : graphs_)
    if (!g->stats().on && s.on) {
      s.on = false;
      s.off_reason = g->stats().off_reason;
    }
  return s;
}

Tensor DataParallel::forward(const Tensor& x) {
  begin_pass(x);
  // One sample's input shape (dim 0 set to 1) keys the known output shape.
  Shape sample_in = x.shape();
  sample_in[0] = 1;
  const bool fused = sample_out_known_ && sample_in == sample_in_;
  if (fused) {
    Shape gs = sample_out_.shape;
    gs[0] = x.size(0);
    ensure(gathered_, gs, sample_out_.dtype, output_device_, sample_out_.format);
  }
  auto gather = [&](int i) {
    Tensor dst = gathered_.slice(starts_[i], starts_[i] + sizes_[i]);
    dst.copy_from(out_chunks_[i], &contexts_[i]->compute());
    contexts_[i]->compute().synchronize();
  };
  run_replicas([&](int i) {
    replica_forward(i, x);
    if (fused) {
      FANOUT_CHECK(out_shapes_[i][0] == sizes_[i] && out_shapes_[i].numel() / sizes_[i] == sample_out_.shape.numel())
          << "replica " << i << " output " << out_shapes_[i].str() << " differs from the expected per-sample "
          << sample_out_.shape.str();
      gather(i);
    }
  });

  if (!fused) {
    // First batch of this input shape: learn the output shape, gather in a second round.
    // The outputs' storage: float32, or a low type (channels-last too) under autocast.
    Shape gs = out_shapes_[0];
    gs[0] = x.size(0);
    ensure(gathered_, gs, out_chunks_[0].dtype(), output_device_, out_chunks_[0].format());
    pool_->run(gather, active_);
    sample_in_ = sample_in;
    sample_out_ = TensorSpec(out_chunks_[0]);
    sample_out_.shape[0] = 1;
    sample_out_known_ = true;
  }
  gathered_pass_ = true;
  return gathered_;
}

void DataParallel::backward(const Tensor& dy) {
  FANOUT_CHECK(training_forward_) << "DataParallel backward needs a training-mode forward before it";
  FANOUT_CHECK(gathered_pass_) << "DataParallel backward after a pass with the loss on the replicas";
  FANOUT_USER_CHECK(dy.shape() == gathered_.shape())
      << "output gradient " << dy.shape().str() << " does not match the output " << gathered_.shape().str();
  run_replicas([&](int i) {
    Tensor chunk = dy.slice(starts_[i], starts_[i] + sizes_[i]);
    if (chunk.device().same_memory(devices_[i])) {
      dy_chunks_[i] = chunk;
    } else {
      ensure(dy_chunks_[i], chunk.shape(), chunk.dtype(), devices_[i], chunk.format());
      dy_chunks_[i].copy_from(chunk, &contexts_[i]->compute());
    }
    replica_backward(i, dy_chunks_[i]);
  });
  reducer_->finish();
}

int64_t DataParallel::gathered_bytes() const {
  int64_t bytes = 0;
  for (int i = 0; i < active_; ++i)
    if (sends_to_output(i)) bytes += out_shapes_[i].numel() * static_cast<int64_t>(dtype_size(gathered_.dtype()));
  return bytes;
}

void DataParallel::forward_backward_local(const Tensor& x, const ReplicaLoss& loss, const ReplicaDone& done,
                                          const ReplicaStage& stage, const std::string& step_key) {
  begin_pass(x);
  if (training_forward_ && stage && !step_key.empty() && graph_stats().on) {
    // Each replica's forward, loss and backward through its StepGraphs:
    // plain, captured or replayed; the buckets' reductions follow the
    // backward's gradient notices, outside any graph.
    run_replicas([&](int i) {
      Context& ctx = *contexts_[i];
      Module& m = replica(i);
      prepare_replica(i, x, true);
      const int64_t begin = starts_[i], end = starts_[i] + sizes_[i];
      stage(i, begin, end, ctx);
      const auto& a = m.arenas();
      const std::string key = step_key + '|' + in_chunks_[i].shape().str() + '|' + std::to_string(active_) + '|' +
                              pointers_key({a.params.raw(), a.grads.raw(), a.buffers.raw(), in_chunks_[i].raw()});
      graphs_[i]->train_step(ctx, key, [&] {
        out_chunks_[i] = m.forward(in_chunks_[i], ctx);
        const Tensor* dy = loss(i, begin, end, out_chunks_[i], ctx);
        FANOUT_CHECK(dy && dy->shape() == out_chunks_[i].shape())
            << "replica " << i << ": the loss gave no output gradient of shape " << out_chunks_[i].shape().str();
        Module::backward_of(m, "model", *dy, ctx);
      });
      out_shapes_[i] = out_chunks_[i].shape();
      finish_backward(i);
      if (done) done(i, ctx);
    });
    reducer_->finish();
    return;
  }
  if (!training_forward_)
    for (auto& g : graphs_) g->other_pass();
  run_replicas([&](int i) {
    Tensor out = replica_forward(i, x);
    const Tensor* dy = loss(i, starts_[i], starts_[i] + sizes_[i], out, *contexts_[i]);
    if (training_forward_) {
      FANOUT_CHECK(dy && dy->shape() == out.shape())
          << "replica " << i << ": the loss gave no output gradient of shape " << out.shape().str();
      replica_backward(i, *dy);
    }
    if (done) done(i, *contexts_[i]);
  });
  reducer_->finish();
}

namespace {
Device first_device(const std::vector<Device>& devices) {
  FANOUT_USER_CHECK(!devices.empty()) << "DataParallel needs at least one device";
  return devices.front();
}

// The engine owns training: the model moves to the primary and needs no dx.
Module& on_primary(Module& m, Device primary) {
  m.to(primary);  // synchronous: nothing else may be ordered before it
  m.set_input_grad(false);
  return m;
}
}  // namespace

DataParallelEngine::DataParallelEngine(Module& model, const std::vector<Device>& devices,
                                       const Criterion& criterion, const DataParallelOptions& opts)
    : dp_(on_primary(model, first_device(devices)), devices, opts), on_replicas_(opts.loss_on_replicas) {
  for (size_t i = 0; i < devices.size(); ++i) criteria_.push_back(criterion.clone());
  targets_.resize(devices.size());
  results_.resize(devices.size());
}

namespace {
// `y` on `device` (a view when it is already there, else a copy into `buf` on ctx's stream).
const Tensor& on_device(const Tensor& y, Device device, Tensor& buf, Context& ctx) {
  if (y.device().same_memory(device)) return y;
  ensure(buf, y.shape(), y.dtype(), device);
  buf.copy_from(y, &ctx.compute());
  return buf;
}
}  // namespace

StepResult DataParallelEngine::loss_step(const Tensor& x, const Tensor& y, bool train, float grad_scale) {
  check_batch_given(x, y);
  FANOUT_USER_CHECK(y.dim() >= 1 && y.size(0) == x.size(0))
      << "the targets " << y.shape().str() << " do not match the batch " << x.shape().str();
  if (!on_replicas_) return gathered_step(x, y, train, grad_scale);
  dp_.module().train(train);
  auto done = [&](int i, Context& ctx) {
    results_[i] = criteria_[i]->read(ctx);  // after backward: waits for this replica's stream only
  };
  if (train && dp_.graph_stats().on) {
    // The targets staged into each replica's own buffer, so that a captured
    // step reads them where a replay will find the next batch's.
    auto stage = [&](int i, int64_t begin, int64_t end, Context& ctx) {
      const Tensor rows = y.slice(begin, end);
      ensure(targets_[i], rows.shape(), rows.dtype(), ctx.device());
      targets_[i].copy_from(rows, &ctx.compute());
    };
    auto loss = [&](int i, int64_t, int64_t, const Tensor& out, Context& ctx) {
      criteria_[i]->forward(ctx, out, targets_[i], true, grad_scale);
      return &criteria_[i]->grad();
    };
    dp_.forward_backward_local(x, loss, done, stage, step_graph_key(x, y, grad_scale, {}));
  } else {
    dp_.forward_backward_local(x, [&](int i, int64_t begin, int64_t end, const Tensor& out, Context& ctx) {
      Criterion& c = *criteria_[i];
      const Tensor rows = y.slice(begin, end);
      const Tensor& t = on_device(rows, ctx.device(), targets_[i], ctx);
      c.forward(ctx, out, t, train, grad_scale);
      return train ? &c.grad() : nullptr;
    }, done);
  }
  StepResult r;
  bytes_to_primary_ = 0;
  for (int i = 0; i < dp_.replicas_used(); ++i) {
    r.merge(results_[i]);
    if (dp_.sends_to_output(i))
      bytes_to_primary_ += criteria_[i]->result_bytes(dp_.replica_output_shape(i));
  }
  return r;
}

StepResult DataParallelEngine::gathered_step(const Tensor& x, const Tensor& y, bool train, float grad_scale) {
  dp_.module().train(train);
  Tensor out = dp_.forward(x);
  Context& octx = dp_.output_context();
  Criterion& c = *criteria_[0];
  const Tensor& t = on_device(y, dp_.output_device(), targets_[0], octx);
  c.forward(octx, out, t, train, grad_scale);
  if (train) {
    octx.compute().synchronize();
    dp_.backward(c.grad());
  }
  StepResult r = c.read(octx);
  // The other replicas' outputs and the targets of their rows reach the output device.
  bytes_to_primary_ = dp_.gathered_bytes();
  const int64_t target_row = static_cast<int64_t>(y.nbytes()) / y.size(0);
  for (int i = 0; i < dp_.replicas_used(); ++i)
    if (dp_.sends_to_output(i)) bytes_to_primary_ += dp_.chunk_rows(i) * target_row;
  return r;
}

StepResult DataParallelEngine::forward_backward(const Tensor& x, const Tensor& y, float grad_scale, bool sync) {
  dp_.set_sync(sync);
  return loss_step(x, y, true, grad_scale);
}

std::vector<Replica> DataParallelEngine::replicas() {
  std::vector<Replica> out;
  for (int i = 0; i < static_cast<int>(dp_.devices().size()); ++i)
    out.push_back({&dp_.replica(i), &dp_.replica_context(i), dp_.grads_in_flight_bytes(i)});
  return out;
}

StepResult DataParallelEngine::eval_step(const Tensor& x, const Tensor& y) { return loss_step(x, y, false, 0.0f); }

GraphStats DataParallelEngine::graph_stats() const {
  if (!on_replicas_) {
    GraphStats s;
    s.off_reason = "gathered outputs (torch's way) run plain launches; graphs capture the loss on the replicas";
    return s;
  }
  return dp_.graph_stats();
}

}  // namespace fanout
