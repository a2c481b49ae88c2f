// Process group over Gloo (TCP transport), its rendezvous stores, and the
// parsing and probing of rendezvous specs.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <gloo/transport/tcp/device.h>
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <mutex>
#include <map>
#include <filesystem>
#include <fstream>

#include "runtime/core/error.h"
#include "runtime/core/half.h"
#include "runtime/distributed/progress_board.h"
#include "runtime/distributed/store.h"

namespace fanout::distributed {

namespace fs = std::filesystem;

std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  // Gloo puts "[path/file.cc:LINE] " before the cause.
  const auto open = line.find('['), close = line.find("] ");
  if (open != std::string::npos && close != std::string::npos && open < close &&
      line.find(".cc:", open) < close)
    line = line.substr(0, open) + line.substr(close + 2);
  return line;
}

Rendezvous Rendezvous::parse(const std::string& spec) {
  Rendezvous r;
  if (spec.rfind("file:", 0) == 0) {
    r.kind = Kind::File;
    r.path = spec.substr(5);
    FANOUT_USER_CHECK(!r.path.empty()) << "bad rendezvous '" << spec << "': file: needs a directory (file:DIR)";
    return r;
  }
  if (spec.rfind("redis:", 0) == 0) {
    r.kind = Kind::Redis;
    const std::string rest = spec.substr(6);
    const auto colon = rest.rfind(':');
    FANOUT_USER_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < rest.size())
        << "bad rendezvous '" << spec << "': expected redis:HOST:PORT";
    r.host = rest.substr(0, colon);
    const std::string port = rest.substr(colon + 1);
    FANOUT_USER_CHECK(port.find_first_not_of("0123456789") == std::string::npos && port.size() <= 5 &&
                      std::stoi(port) >= 1 && std::stoi(port) <= 65535)
        << "bad rendezvous '" << spec << "': port '" << port << "' is not in 1..65535";
    r.port = std::stoi(port);
    return r;
  }
  FANOUT_FAIL() << "bad rendezvous '" << spec << "' (expected file:DIR or redis:HOST:PORT)";
}

std::string Rendezvous::str() const {
  return kind == Kind::File ? "file:" + path : "redis:" + host + ":" + std::to_string(port);
}

void probe_rendezvous(const Rendezvous& r, double timeout_s) {
  if (r.kind == Rendezvous::Kind::File) {
    std::error_code ec;
    fs::create_directories(r.path, ec);
    FANOUT_USER_CHECK(!ec && fs::is_directory(r.path))
        << "rendezvous directory " << r.path << " cannot be created: " << ec.message();
    const std::string probe = r.path + "/.probe." + std::to_string(::getpid());
    std::ofstream(probe) << "x";
    const bool ok = fs::exists(probe);
    fs::remove(probe, ec);
    FANOUT_USER_CHECK(ok) << "rendezvous directory " << r.path << " is not writable";
    return;
  }
  const double t = std::min(timeout_s, 10.0);
  timeval tv{static_cast<time_t>(t), static_cast<suseconds_t>((t - static_cast<time_t>(t)) * 1e6)};
  redisContext* c = redisConnectWithTimeout(r.host.c_str(), r.port, tv);
  std::string err;
  if (c == nullptr) {
    err = "out of memory";
  } else if (c->err) {
    err = c->errstr;
  } else {
    redisSetTimeout(c, tv);
    auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
    if (reply == nullptr) err = c->err ? c->errstr : "no reply to PING";
    else if (reply->type == REDIS_REPLY_ERROR) err = reply->str;
    if (reply) freeReplyObject(reply);
  }
  if (c) redisFree(c);
  FANOUT_USER_CHECK(err.empty()) << "cannot reach the Redis rendezvous at " << r.host << ":" << r.port << ": "
                                 << err;
}

std::shared_ptr<gloo::rendezvous::Store> open_store(const Rendezvous& r, const std::string& run_id,
                                                    double timeout_s) {
  std::shared_ptr<gloo::rendezvous::Store> base;
  try {
    if (r.kind == Rendezvous::Kind::File)
      base = std::make_shared<gloo::rendezvous::FileStore>(r.path);
    else
      base = std::make_shared<gloo::rendezvous::RedisStore>(r.host, r.port);
  } catch (const std::exception& e) {
    FANOUT_FAIL() << "cannot open the rendezvous " << r.str() << ": " << first_line(e.what());
  }
  // PrefixStore keeps a reference; the shared_ptr below keeps `base` alive with it.
  // Waits without a timeout (connectFullMesh's, get's) get ours instead of Gloo's 30 s.
  struct Owned : gloo::rendezvous::PrefixStore {
    Owned(const std::string& p, std::shared_ptr<gloo::rendezvous::Store> b, std::chrono::milliseconds t)
        : gloo::rendezvous::PrefixStore(p, *b), base(std::move(b)), timeout(t) {}
    void wait(const std::vector<std::string>& keys) override { PrefixStore::wait(keys, timeout); }
    using PrefixStore::wait;
    std::vector<char> get(const std::string& key) override {
      PrefixStore::wait({key}, timeout);
      return PrefixStore::get(key);
    }
    std::shared_ptr<gloo::rendezvous::Store> base;
    std::chrono::milliseconds timeout;
  };
  return std::make_shared<Owned>("fanout/" + run_id, base,
                                 std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
}

namespace {

using Ms = std::chrono::milliseconds;

// c = a + b over bfloat16 bit patterns, each sum rounded to nearest even.
void sum_bf16(void* c, const void* a, const void* b, size_t n) {
  auto* pc = static_cast<uint16_t*>(c);
  const auto *pa = static_cast<const uint16_t*>(a), *pb = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) pc[i] = half::bf16_from_float(half::float_from_bf16(pa[i]) + half::float_from_bf16(pb[i]));
}

// Sets buf as the output of a summing collective (F32, F64, I64 or BF16); false for other dtypes.
template <class Options>
bool sum_into(Options& opts, Tensor& buf) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (buf.dtype()) {
    case DType::BF16:
      opts.setOutput(static_cast<uint16_t*>(buf.raw()), static_cast<size_t>(buf.numel()));
      opts.setReduceFunction(static_cast<Fn>(&sum_bf16));
      return true;
    case DType::F32:
      opts.setOutput(buf.data<float>(), buf.numel());
      opts.setReduceFunction(static_cast<Fn>(&gloo::sum<float>));
      return true;
    case DType::F64:
      opts.setOutput(buf.data<double>(), buf.numel());
      opts.setReduceFunction(static_cast<Fn>(&gloo::sum<double>));
      return true;
    case DType::I64:
      opts.setOutput(buf.data<int64_t>(), buf.numel());
      opts.setReduceFunction(static_cast<Fn>(&gloo::sum<int64_t>));
      return true;
    default:
      return false;
  }
}

class GlooGroup : public ProcessGroup {
 public:
  GlooGroup(const GroupOptions& o) : ProcessGroup(o.rank, o.world_size, o.timeout_s), skip_(o.skip) {
    FANOUT_USER_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size)
        << "rank " << o.rank << " is outside a world of " << o.world_size;
    FANOUT_USER_CHECK(o.timeout_s > 0) << "the process group's timeout must be positive, got " << o.timeout_s;
    const Rendezvous r = Rendezvous::parse(o.rendezvous);
    timeout_ = Ms(static_cast<int64_t>(o.timeout_s * 1000));
    gloo::transport::tcp::attr attr;
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
      attr.iface = ifname;
    } else if (r.kind == Rendezvous::Kind::File) {
      attr.hostname = "127.0.0.1";
    } else {
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      attr.hostname = host;
    }
    const std::string where = "rendezvous over " + r.str() + " (rank " + std::to_string(rank_) + " of " +
                              std::to_string(size_) + ")";
    try {
      auto store = open_store(r, o.run_id, o.timeout_s);
      device_ = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      ctx->setTimeout(timeout_);
      ctx->connectFullMesh(*store, device_);
      ctx_ = ctx;
    } catch (const fanout::Error&) {
      throw;
    } catch (const std::exception& e) {
      FANOUT_FAIL() << where << " failed within " << o.timeout_s << " s (every rank must join; the timeout sets the wait): "
                    << first_line(e.what());
    }
  }

  std::string backend() const override { return "gloo"; }
  bool host_memory() const override { return true; }

  void broadcast(Tensor& buf, int root, const std::string& what, uint32_t tag) override {
    check_host(buf, what);
    run(what, buf.numel(), tag, [&](uint32_t wire) {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(static_cast<uint8_t*>(buf.raw()), buf.nbytes());
      opts.setRoot(root);
      opts.setTag(wire);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void all_reduce(Tensor& buf, const std::string& what, uint32_t tag) override {
    check_host(buf, what);
    if (buf.numel() == 0) return;
    count_summed(buf);
    run(what, buf.numel(), tag, [&](uint32_t wire) {
      gloo::AllreduceOptions opts(ctx_);
      opts.setTag(wire);
      opts.setTimeout(timeout_);
      FANOUT_CHECK(sum_into(opts, buf)) << what << ": all-reduce of " << dtype_name(buf.dtype()) << " is not supported";
      gloo::allreduce(opts);
    });
  }

  void reduce(Tensor& buf, int root, const std::string& what, uint32_t tag) override {
    check_host(buf, what);
    FANOUT_CHECK(root >= 0 && root < size_) << what << ": reduce onto rank " << root << " of " << size_;
    if (buf.numel() == 0) return;
    count_summed(buf);
    run(what, buf.numel(), tag, [&](uint32_t wire) {
      gloo::ReduceOptions opts(ctx_);
      opts.setRoot(root);
      opts.setTag(wire);
      opts.setTimeout(timeout_);
      FANOUT_CHECK(buf.dtype() != DType::I64 && sum_into(opts, buf))
          << what << ": reduce of " << dtype_name(buf.dtype()) << " is not supported";
      gloo::reduce(opts);
    });
  }

  void all_gather(const Tensor& in, Tensor& out, const std::string& what, uint32_t tag) override {
    check_host(in, what);
    check_host(out, what);
    FANOUT_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * size_)
        << what << ": all-gather of " << in.shape().str() << " into " << out.shape().str();
    if (size_ == 1) {
      out.copy_from(in.view(out.shape()));
      return;
    }
    run(what, out.numel(), tag, [&](uint32_t wire) {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(static_cast<uint8_t*>(in.raw()), in.nbytes());
      opts.setOutput(static_cast<uint8_t*>(out.raw()), out.nbytes());
      opts.setTag(wire);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  void barrier(const std::string& what, uint32_t tag) override {
    run(what, 0, tag, [&](uint32_t wire) {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(wire);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  void check_host(const Tensor& t, const std::string& what) const {
    FANOUT_CHECK(t.defined() && t.device().is_cpu()) << what << ": the Gloo group takes host tensors";
  }
  // Gloo pairs messages by tag: the wire tag carries the collective's number
  // among this tag's, so a rank that skipped or added a collective meets no
  // one (every rank then times out, numbers in the error) instead of summing
  // another collective's buffer.
  template <class F>
  void run(const std::string& what, int64_t elements, uint32_t tag, F&& f) {
    FANOUT_CHECK(ctx_) << what << ": the process group failed earlier";
    FANOUT_CHECK(tag < 256) << what << ": tag " << tag << " (the group takes tags below 256)";
    if (size_ == 1) return;
    uint32_t n;
    {
      std::lock_guard<std::mutex> g(seq_mu_);
      n = ++seq_[tag];
    }
    if (skip_.rank == rank_ && skip_.tag == tag && skip_.n == n) return;  // an injected fault: this rank misses it
    CollectiveMark mark(what, elements, n);  // the launcher's view of where this rank is
    try {
      f(tag << 24 | (n & 0xffffff));
    } catch (const std::exception& e) {
      ctx_.reset();
      FANOUT_FAIL() << what << " failed on rank " << rank_ << " of " << size_ << " (its collective #" << n
                    << " of tag " << tag << "; timeout " << timeout_s_ << " s): " << first_line(e.what());
    }
  }

  Ms timeout_;
  std::mutex seq_mu_;
  std::map<uint32_t, uint32_t> seq_;  // collectives so far, per tag
  SkippedCollective skip_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> ctx_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_gloo_group(const GroupOptions& opts) { return std::make_unique<GlooGroup>(opts); }

void check_agreement(ProcessGroup& g, const Agreement& fields,
                     const std::function<void(const Tensor& in, Tensor& out)>& gather) {
  const int64_t n = static_cast<int64_t>(fields.size());
  if (g.size() == 1 || n == 0) return;
  Tensor mine = Tensor::empty(Shape{n + 1}, DType::I64);
  mine.data<int64_t>()[0] = n;  // a rank built from other code would list other fields
  for (int64_t i = 0; i < n; ++i) mine.data<int64_t>()[i + 1] = fields[static_cast<size_t>(i)].second;
  Tensor all = Tensor::empty(Shape{g.size() * (n + 1)}, DType::I64);
  gather(mine, all);
  const int64_t* v = all.data<int64_t>();
  for (int r = 1; r < g.size(); ++r) {
    const int64_t* theirs = v + r * (n + 1);
    FANOUT_USER_CHECK(theirs[0] == n) << "rank " << r << " describes its run with " << theirs[0]
                                      << " fields where rank 0 has " << n << " (every rank must run the same program)";
    for (int64_t i = 0; i < n; ++i)
      FANOUT_USER_CHECK(theirs[i + 1] == v[i + 1])
          << "rank " << r << " has " << fields[static_cast<size_t>(i)].first << " " << theirs[i + 1]
          << " where rank 0 has " << v[i + 1] << " (every rank must run the same model and options)";
  }
}

}  // namespace fanout::distributed
