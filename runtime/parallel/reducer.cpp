// Gradient buckets, their per-replica readiness, and the reducer.
#include "runtime/parallel/reducer.h"

#include <algorithm>

#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "runtime/core/error.h"

namespace fanout {

BucketLayout::BucketLayout(Module& model, size_t bucket_bytes) {
  struct P {
    int64_t offset, numel;
    std::string name;
  };
  std::vector<P> ps;
  for (auto& [name, p] : model.named_parameters()) ps.push_back({p->offset, p->shape.numel(), name});
  std::sort(ps.begin(), ps.end(), [](const P& a, const P& b) { return a.offset < b.offset; });
  const int64_t target =
      std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / dtype_size(model.grad_dtype())));
  const int64_t arena = model.arenas().params.numel();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (buckets_.empty() || buckets_.back().count >= target)
      buckets_.push_back({ps[i].offset, 0, static_cast<int>(i), 0});
    GradBucket& b = buckets_.back();
    const int64_t end = i + 1 < ps.size() ? ps[i + 1].offset : arena;
    b.count = end - b.begin;
    b.params++;
    offsets_.push_back(ps[i].offset);
    bucket_of_.push_back(static_cast<int>(buckets_.size()) - 1);
    names_.push_back(ps[i].name);
  }
}

std::pair<int, int> BucketLayout::params_in(size_t begin, size_t count) const {
  auto lo = std::lower_bound(offsets_.begin(), offsets_.end(), static_cast<int64_t>(begin));
  auto hi = std::lower_bound(lo, offsets_.end(), static_cast<int64_t>(begin + count));
  return {static_cast<int>(lo - offsets_.begin()), static_cast<int>(hi - offsets_.begin())};
}

BucketReadiness::BucketReadiness(const BucketLayout& layout, int ranks, std::function<void(int, int)> issue)
    : layout_(layout),
      issue_(std::move(issue)),
      param_ready_(ranks, std::vector<char>(layout.num_params(), 0)),
      bucket_ready_(ranks, std::vector<int>(layout.size(), 0)),
      next_(ranks, layout.size() - 1) {}

void BucketReadiness::begin() {
  for (auto& r : param_ready_) std::fill(r.begin(), r.end(), 0);
  for (auto& r : bucket_ready_) std::fill(r.begin(), r.end(), 0);
  std::fill(next_.begin(), next_.end(), layout_.size() - 1);
}

void BucketReadiness::grad_ready(int rank, size_t begin, size_t count) {
  const auto [lo, hi] = layout_.params_in(begin, count);
  for (int p = lo; p < hi; ++p) {
    FANOUT_CHECK(!param_ready_[rank][p]) << "gradient of " << layout_.param_name(p) << " reported twice in one pass";
    param_ready_[rank][p] = 1;
    ++bucket_ready_[rank][layout_.bucket_of(p)];
  }
  issue_ready(rank);
}

void BucketReadiness::flush(int rank) {
  for (int b = 0; b < layout_.size(); ++b) bucket_ready_[rank][b] = layout_.buckets()[b].params;
  issue_ready(rank);
}

std::vector<std::string> BucketReadiness::unready(int rank) const {
  std::vector<std::string> out;
  for (int p = 0; p < layout_.num_params(); ++p)
    if (!param_ready_[rank][p]) out.push_back(layout_.param_name(p));
  return out;
}

void BucketReadiness::issue_ready(int rank) {
  int& next = next_[rank];
  while (next >= 0 && bucket_ready_[rank][next] == layout_.buckets()[next].params) issue_(rank, next--);
}

std::pair<int64_t, int64_t> bucket_hull(const BucketLayout& layout, std::pair<int64_t, int64_t> range) {
  int64_t lo = -1, hi = -1;
  for (const GradBucket& bk : layout.buckets())
    if (bk.begin < range.second && bk.begin + bk.count > range.first) {
      if (lo < 0) lo = bk.begin;
      hi = bk.begin + bk.count;
    }
  if (lo < 0) return {range.first, range.first};  // an empty shard
  return {lo, hi};
}

std::vector<std::vector<ReducePiece>> reduce_pieces(const BucketLayout& layout, const ShardPlan& plan) {
  std::vector<std::vector<ReducePiece>> out(layout.size());
  int op = 0;
  for (int b = 0; b < layout.size(); ++b) {
    const GradBucket& bk = layout.buckets()[b];
    if (plan.empty()) {
      out[b].push_back({op++, 0, plan.rank(), bk.begin, bk.count});
      continue;
    }
    for (int s = 0; s < plan.shards(); ++s) {
      const auto [sb, se] = plan.range(s);
      const int64_t lo = std::max(bk.begin, sb), hi = std::min(bk.begin + bk.count, se);
      if (lo < hi) out[b].push_back({op++, plan.receiver(s), plan.home(s), lo, hi - lo});
    }
  }
  return out;
}

Reducer::Reducer(std::vector<Module*> replicas, std::vector<Context*> contexts, Comm& comm, const BucketLayout& layout,
                 const ReducerOptions& o)
    : replicas_(std::move(replicas)),
      contexts_(std::move(contexts)),
      comm_(comm),
      layout_(layout),
      opts_(o),
      pieces_(reduce_pieces(layout, o.shards)),
      ready_(layout, static_cast<int>(replicas_.size()), [this](int rank, int b) { local(rank, b); }),
      arrivals_(std::make_unique<std::atomic<int>[]>(layout.size())),
      host_memory_(contexts_[0]->device().is_cpu()),
      reduced_locally_(layout.size(), 0) {
  FANOUT_CHECK(o.reduce_dtype == DType::F32 || o.reduce_dtype == DType::BF16)
      << "gradients cannot be reduced in " << dtype_name(o.reduce_dtype);
  FANOUT_USER_CHECK(o.reduce_dtype == DType::F32 || replicas_[0]->grad_dtype() == DType::F32)
      << "bf16 gradient reduction cannot keep split-invariant math's exact float64 gradient sums";
  if (o.shards.mode() == ShardMode::Grads) {
    FANOUT_USER_CHECK(host_memory_) << "sharded gradients (--shard-grads) run on CPU devices so far; on "
                                    << contexts_[0]->device().str() << " use --shard-optimizer";
    in_flight_ = true;
    done_.assign(layout.size(), 0);
    for (size_t r = 0; r < replicas_.size(); ++r) {
      Module& m = *replicas_[r];
      const auto [wb, we] = bucket_hull(layout, o.shards.local(static_cast<int>(r)));
      FANOUT_CHECK(m.arenas().grads_begin == wb && m.arenas().grads.numel() == we - wb)
          << "replica " << r << "'s gradient arena is not the buckets its shard meets";
      InFlight f;
      f.pool = std::make_unique<SlotPool>(m.grad_dtype(), m.device());
      for (auto& [n, prm] : m.named_parameters()) f.params.push_back(prm);
      std::sort(f.params.begin(), f.params.end(), [](const Parameter* a, const Parameter* b) { return a->offset < b->offset; });
      f.block.resize(layout.size());
      for (const GradBucket& bk : layout.buckets()) {
        const bool through = bk.begin < wb || bk.begin + bk.count > we;
        f.through.push_back(through);
        for (int i = bk.first_param; i < bk.first_param + bk.params && through; ++i) f.params[i]->grad = Tensor();
      }
      flight_.push_back(std::move(f));
    }
  }
  if (o.group) {
    const char* op = o.shards.empty() ? "all-reduce" : "reduce onto the owners";
    for (int b = 0; b < layout.size(); ++b)
      global_names_.push_back(op + std::string(" of gradient bucket ") + std::to_string(b) + " of " +
                              std::to_string(layout.size()));
    link_ = std::make_unique<ProcessLink>(o.group, *contexts_[0]);
    if (link_->host() && contexts_[0]->device().is_cpu()) thread_ = std::thread([this] { global_loop(); });
  }
}

Reducer::~Reducer() {
  bool busy;
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    busy = busy_;
  }
  cv_.notify_all();
  if (!thread_.joinable()) return;
  if (busy) {
    // A collective is in flight after a failure elsewhere; it cannot be
    // interrupted and may wait for its timeout. Leave the thread, and the
    // group it uses, to the process's exit instead of blocking here.
    thread_.detach();
    new std::shared_ptr<distributed::ProcessGroup>(opts_.group);  // never released
  } else {
    thread_.join();
  }
}

void Reducer::begin(int active, bool training, bool sync) {
  active_ = active;
  training_ = training;
  // ZeRO-2 reduces across processes after every pass: no process keeps
  // another's sums (DDP's no_sync would need the whole gradient here).
  sync_ = (sync || in_flight_) && link_ != nullptr;
  // Sharded with a replica sitting out: its pieces reach their owner in finish(), before they are sent on.
  deferred_ = sync_ && !in_flight_ && !opts_.shards.empty() && active < static_cast<int>(replicas_.size());
  if (in_flight_) {
    for (size_t r = 0; r < flight_.size(); ++r)  // blocks a failed pass left open
      for (int b = 0; b < layout_.size(); ++b)
        if (flight_[r].block[b].defined()) close_block(static_cast<int>(r), b);
    std::lock_guard<std::mutex> g(done_mu_);
    std::fill(done_.begin(), done_.end(), 0);
    aborted_ = false;
  }
  ready_.begin();
  for (int b = 0; b < layout_.size(); ++b) arrivals_[b] = 0;
  if (thread_.joinable()) {
    std::lock_guard<std::mutex> g(mu_);
    std::fill(reduced_locally_.begin(), reduced_locally_.end(), 0);
    error_ = nullptr;
    next_ = training && sync_ && !deferred_ && !in_flight_ ? layout_.size() - 1 : -1;
  }
}

void Reducer::grad_ready(int rank, size_t begin, size_t count) {
  if (training_) ready_.grad_ready(rank, begin, count);
}

Tensor Reducer::bucket_of(int rank, int b) {
  const GradBucket& bk = layout_.buckets()[b];
  return replicas_[rank]->arenas().grads.flat(bk.begin, Shape{bk.count});
}

void Reducer::round(int rank, Tensor& t) {
  if (opts_.reduce_dtype == DType::BF16) kernels::round_to(*contexts_[rank], t, DType::BF16);
}

void Reducer::round_piece(int rank, const ReducePiece& p) {
  Tensor t = replicas_[rank]->arenas().grads.flat(p.begin, Shape{p.count});
  round(rank, t);
}

void Reducer::grad_write(int rank, size_t begin, size_t count) {
  if (!in_flight_ || !training_) return;
  const auto [lo, hi] = layout_.params_in(begin, count);
  for (int p = lo; p < hi; ++p) {
    const int b = layout_.bucket_of(p);
    if (flight_[rank].through[b] && !flight_[rank].block[b].defined()) open_block(rank, b);
  }
}

void Reducer::open_block(int rank, int b) {
  InFlight& f = flight_[rank];
  const GradBucket& bk = layout_.buckets()[b];
  f.block[b] = f.pool->take(bk.count);
  f.block[b].zero(&contexts_[rank]->compute());
  for (int i = bk.first_param; i < bk.first_param + bk.params; ++i) {
    Parameter& p = *f.params[i];
    p.grad = f.block[b].flat(p.offset - bk.begin, p.shape);
  }
}

void Reducer::close_block(int rank, int b) {
  InFlight& f = flight_[rank];
  const GradBucket& bk = layout_.buckets()[b];
  for (int i = bk.first_param; i < bk.first_param + bk.params; ++i) f.params[i]->grad = Tensor();
  f.pool->give(f.block[b]);
  f.block[b] = Tensor();
}

Tensor Reducer::piece_buffer(int rank, int b, const ReducePiece& p) {
  if (!in_flight_ || !flight_[rank].through[b]) return replicas_[rank]->arenas().grad_range(p.begin, p.count);
  return flight_[rank].block[b].flat(p.begin - layout_.buckets()[b].begin, Shape{p.count});
}

void Reducer::local_in_flight(int rank, int b) {
  InFlight& f = flight_[rank];
  Context& ctx = *contexts_[rank];
  if (f.through[b] && !f.block[b].defined()) open_block(rank, b);  // no gradient this pass: zeros
  for (const ReducePiece& p : pieces_[b]) {
    Tensor g = piece_buffer(rank, b, p);
    if (active_ > 1) round(rank, g);
    comm_.reduce_add(p.op, rank, g, ctx, root(p));
  }
  if (arrivals_[b].fetch_add(1) + 1 == active_) {
    // Every reduce_add of the bucket has returned: the sums are final, in
    // their owners' windows, or for an owner that sat out in the primary's
    // buffer (added into the owner's window here); other processes' stay in
    // the primary's buffer for the global stage.
    const int me = link_ ? link_->rank() : 0;
    for (const ReducePiece& p : pieces_[b]) {
      const int r = root(p);
      Tensor sum = piece_buffer(r, b, p);
      if (active_ > 1 && opts_.reduce_dtype != DType::F32) round(rank, sum);
      if (p.home != me || r == p.owner) continue;
      Tensor mine = replicas_[p.owner]->arenas().grad_range(p.begin, p.count);
      add_into(ctx, sum, mine);
    }
    {
      std::lock_guard<std::mutex> g(done_mu_);
      done_[b] = 1;
    }
    done_cv_.notify_all();
  } else {
    std::unique_lock<std::mutex> lk(done_mu_);
    done_cv_.wait(lk, [&] { return done_[b] || aborted_; });
    FANOUT_CHECK(done_[b]) << "gradient bucket " << b << " abandoned: another replica failed";
  }
  if (rank == 0 && sync_) global_in_flight(b);
  if (f.through[b]) close_block(rank, b);
}

void Reducer::global_in_flight(int b) {
  const int me = link_->rank();
  for (const ReducePiece& p : pieces_[b]) {
    // This process's shards: the owner's window (its earlier passes' sums
    // included: the others send this pass's alone); others': the primary's block.
    Tensor g = p.home == me ? replicas_[p.owner]->arenas().grad_range(p.begin, p.count) : piece_buffer(0, b, p);
    link_->reduce(g, p.home, global_names_[b], kTagGrads, opts_.reduce_dtype);
  }
}

void Reducer::local(int rank, int b) {
  if (in_flight_) return local_in_flight(rank, b);
  for (const ReducePiece& p : pieces_[b]) {
    Tensor g = replicas_[rank]->arenas().grads.flat(p.begin, Shape{p.count});
    if (active_ > 1) round(rank, g);
    // A shard whose replica sits out this pass: its sum goes to the primary (finish() passes it on).
    comm_.reduce_add(p.op, rank, g, *contexts_[rank], root(p));
  }
  // The replica whose arrival completes the count has seen every reduce_add
  // of this bucket return, so the sums are final (host comms).
  if (arrivals_[b].fetch_add(1) + 1 != active_ || !host_memory_) return;
  if (active_ > 1 && opts_.reduce_dtype != DType::F32)
    for (const ReducePiece& p : pieces_[b]) round_piece(root(p), p);
  if (!thread_.joinable() || !sync_ || deferred_) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    reduced_locally_[b] = 1;
  }
  cv_.notify_all();
}

void Reducer::global(int b) {
  // In bfloat16 (--grad-reduce-dtype bf16) the bucket travels and is summed
  // as bfloat16: half the bytes, and the rounding before and after the sum
  // is the conversion's.
  if (opts_.shards.empty()) {
    Tensor g = bucket_of(0, b);
    link_->all_reduce(g, global_names_[b], kTagGrads, opts_.reduce_dtype);
    return;
  }
  const int me = link_->group().rank();
  for (const ReducePiece& p : pieces_[b]) {
    Tensor g = replicas_[p.owner]->arenas().grads.flat(p.begin, Shape{p.count});
    // Every process sends the piece in the wire type (an owner on another device than the primary's through a copy).
    link_->reduce(g, p.home, global_names_[b], kTagGrads, opts_.reduce_dtype);
    if (p.home != me) g.zero(&contexts_[p.owner]->compute());  // sent on: this process's share starts again from zero
  }
}

void Reducer::global_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (next_ >= 0 && reduced_locally_[next_]); });
    if (stop_) return;
    const int b = next_;
    busy_ = true;
    lk.unlock();
    std::exception_ptr err;
    try {
      global(b);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    busy_ = false;
    if (err) {
      error_ = err;
      next_ = -1;
    } else {
      --next_;
    }
    if (next_ < 0) cv_.notify_all();
  }
}

void Reducer::add_into(Context& ctx, const Tensor& sum, Tensor& mine) {
  if (sum.dtype() == DType::F64) {  // split-invariant gradients (host memory)
    for (int64_t i = 0; i < sum.numel(); ++i) mine.f64()[i] += sum.f64()[i];
  } else if (sum.device() == mine.device()) {
    kernels::axpy(ctx, 1.0f, sum, mine);
  } else {  // another GPU: through a copy on the owner's device
    ensure(sat_out_, sum.shape(), DType::F32, mine.device());
    sat_out_.copy_from(sum, &ctx.compute());
    kernels::axpy(ctx, 1.0f, sat_out_, mine);
  }
}

void Reducer::pass_on_sat_out() {
  for (const auto& ps : pieces_)
    for (const ReducePiece& p : ps) {
      if (p.owner < active_) continue;
      Tensor sum = replicas_[0]->arenas().grads.flat(p.begin, Shape{p.count});
      Tensor mine = replicas_[p.owner]->arenas().grads.flat(p.begin, Shape{p.count});
      Context& ctx = *contexts_[p.owner];
      add_into(ctx, sum, mine);
      if (!host_memory_) ctx.compute().synchronize();
    }
}

void Reducer::finish() {
  if (!training_ || in_flight_) return;  // in flight: every bucket was reduced as backward went
  if (!host_memory_) {
    // Stream-ordered local sums: complete before they are read.
    Context& ctx = *contexts_[0];
    ctx.compute().synchronize();
    ctx.comm().synchronize();
    // Sharded: sums on the other replicas (NCCL reduces onto their streams)
    // are read by the global stage and by the primary's copies.
    if (!opts_.shards.empty())
      for (Context* c : contexts_) c->compute().synchronize();
    if (active_ > 1 && opts_.reduce_dtype != DType::F32) {
      for (const auto& ps : pieces_)
        for (const ReducePiece& p : ps) round_piece(root(p), p);
      // Done before the global stage reads the sums on the primary's stream (and writes them back);
      // in one process each owner's later work is on its own stream, after them.
      if (sync_)
        for (Context* c : contexts_) c->compute().synchronize();
    }
  }
  if (thread_.joinable() && sync_ && !deferred_) {
    // The global stage ran during backward (every owner took part).
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return next_ < 0; });
    if (error_) std::rethrow_exception(error_);
    return;
  }
  pass_on_sat_out();
  if (!sync_) return;
  for (int b = layout_.size() - 1; b >= 0; --b) global(b);
}

void Reducer::abort() {
  {
    std::lock_guard<std::mutex> g(mu_);
    next_ = -1;
  }
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> g(done_mu_);
    aborted_ = true;
  }
  done_cv_.notify_all();
}

}  // namespace fanout
