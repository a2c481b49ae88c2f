// Process group over Gloo (TCP transport).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "runtime/core/error.h"
#include "runtime/core/half.h"
#include "runtime/distributed/progress_board.h"
#include "runtime/distributed/store.h"

namespace fanout::distributed {

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
    // A failed collective asks the peer machines whether they answer: its
    // wait leaves time for that inside the timeout.
    probe_s_ = std::min(0.5, o.timeout_s / 20);
    timeout_ = Ms(static_cast<int64_t>((o.timeout_s - 2 * probe_s_) * 1000));
    gloo::transport::tcp::attr attr;
    std::string me;  // the address peers reach this rank at
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
      me = interface_address(ifname);
      attr.iface = ifname;
    } else if (r.kind == Rendezvous::Kind::File) {
      me = attr.hostname = "127.0.0.1";
    } else if (me = route_address(r.host, r.port); !me.empty()) {
      attr.hostname = me;
    } else {
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      attr.hostname = me = host;
    }
    const std::string where = "rendezvous over " + r.str() + " (rank " + std::to_string(rank_) + " of " +
                              std::to_string(size_) + ")";
    const auto start = std::chrono::steady_clock::now();
    // What is left of the timeout; none left is the join's failure (a wait of
    // 0 would be Gloo's "no timeout").
    const auto left = [&] {
      const Ms l = timeout_ - std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - start);
      if (l <= Ms(0)) throw gloo::IoException("the rendezvous took the whole timeout");
      return l;
    };
    // The keys this rank set, removed when the rendezvous fails with an
    // error: a retry with this --run-id meets no address of the failed attempt.
    std::vector<std::string> mine;
    bool keep = false;  // a world mismatch: the keys stay, so the other side reads it too
    try {
      auto store = open_store(r, o.run_id, o.timeout_s);
      const std::string world = std::to_string(size_);
      store->set("size/" + std::to_string(rank_), std::vector<char>(world.begin(), world.end()));
      mine.push_back("size/" + std::to_string(rank_));
      store->set("host/" + std::to_string(rank_), std::vector<char>(me.begin(), me.end()));
      mine.push_back("host/" + std::to_string(rank_));
      // Every rank joins within the timeout, for the same world (rank 0 is in
      // any: compared first; a rank that finds another world says so under
      // "mismatch", which the waiting ranks look for every few seconds); then
      // the connections share what is left of it: Gloo waits for each of its
      // (size - 1) peers' addresses its timeout, then 5 times it to connect.
      const auto mismatch = [&](const std::string& why) {
        keep = true;
        try {
          store->set("mismatch", std::vector<char>(why.begin(), why.end()));
        } catch (const std::exception&) {  // another rank said it first
        }
        FANOUT_FAIL() << where << ": " << why;
      };
      const auto same_world = [&](int i) {
        const std::vector<char> v = store->get("size/" + std::to_string(i));
        const std::string theirs(v.begin(), v.end());
        if (theirs != world)
          mismatch("rank " + std::to_string(i) + " was started for a world of " + theirs + " processes, rank " +
                   std::to_string(rank_) + " for " + world +
                   " (every machine needs the same --nnodes, and --nproc-per-node or device count)");
      };
      // When the wait ends: the ranks whose keys are still missing, by number (none: all came at the last moment).
      const auto fail_unless_joined = [&](const std::vector<std::string>& keys) {
        const std::vector<std::string> missing = missing_keys(*store, keys);
        if (missing.empty()) return;
        std::string ranks;
        for (const std::string& k : missing) ranks += (ranks.empty() ? "" : ", ") + k.substr(k.find('/') + 1);
        FANOUT_FAIL() << where << ": " << (missing.size() == 1 ? "rank " : "ranks ") << ranks << " did not join within "
                      << o.timeout_s << " s (every rank must join within --timeout: is every machine started, with "
                      << "this --rdzv and --run-id, and a --node-rank of its own?)";
      };
      const auto join = [&](const std::vector<std::string>& keys) {
        for (;;) {
          Ms l{};
          try {
            l = left();
          } catch (const gloo::IoException&) {
            fail_unless_joined(keys);
            return;
          }
          try {
            store->wait(keys, std::min(l, Ms(3000)));
            return;
          } catch (const gloo::IoException&) {
            if (l <= Ms(3000)) {
              fail_unless_joined(keys);
              return;
            }
          }
          try {
            store->wait({"mismatch"}, Ms(1));  // Gloo's waits count whole seconds: about 1 s
          } catch (const gloo::IoException&) {
            continue;
          }
          const std::vector<char> v = store->get("mismatch");
          keep = true;
          FANOUT_FAIL() << where << ": " << std::string(v.begin(), v.end());
        }
      };
      join({"size/0"});
      same_world(0);
      std::vector<std::string> joined;
      for (int i = 0; i < size_; ++i) joined.push_back("host/" + std::to_string(i));
      join(joined);
      for (int i = 1; i < size_; ++i) same_world(i);
      device_ = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      ctx->setTimeout(std::max(Ms(1000), left() / (6 * std::max(1, size_ - 1))));
      for (const char* k : {"", "rank_"}) mine.push_back(k + std::to_string(rank_));  // Gloo's own
      ctx->connectFullMesh(*store, device_);
      ctx->setTimeout(timeout_);
      for (int i = 0; i < size_; ++i) {
        const auto v = store->get("host/" + std::to_string(i));
        hosts_.emplace_back(v.begin(), v.end());
      }
      // Every rank has read every key: rank 0 clears them, so the same --run-id can meet again.
      gloo::BarrierOptions opts(ctx);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
      if (rank_ == 0) {
        std::vector<std::string> keys;
        for (int i = 0; i < size_; ++i)
          for (const char* k : {"", "rank_", "host/", "size/"}) keys.push_back(k + std::to_string(i));
        forget_keys(r, o.run_id, keys);
      }
      ctx_ = ctx;
    } catch (const fanout::Error&) {
      if (!keep) forget_keys(r, o.run_id, mine);
      throw;
    } catch (const std::exception& e) {
      forget_keys(r, o.run_id, mine);
      const std::string cause = first_line(e.what());
      const bool connect = cause.find("Connect timeout") != std::string::npos ||
                           cause.find("Connection refused") != std::string::npos;
      // Redis's SETNX answers 0 (Gloo: "reply->integer == 1"), the file store finds the file: the key is there.
      const bool taken = cause.find("already set") != std::string::npos ||
                         cause.find("File already exists") != std::string::npos ||
                         cause.find("reply->integer == 1") != std::string::npos;
      FANOUT_USER_CHECK(!taken) << where << ": this rank is registered already (another process registered it in "
                                << "this run: two machines with one --node-rank, a run of another world, or a run with "
                                << "--run-id " << o.run_id << " killed in its rendezvous, left its keys; give each "
                                << "machine its own --node-rank and this run another --run-id)";
      FANOUT_FAIL() << where << " failed within " << o.timeout_s << " s (every rank must join; the timeout sets the wait): "
                    << cause
                    << (connect ? " (every rank joined the rendezvous, but this one could not connect to a peer: the "
                                  "machines must reach each other on any TCP port, over the interface --iface names)"
                                : "");
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
      const std::string cause = first_line(e.what());
      FANOUT_FAIL() << what << " failed on rank " << rank_ << " of " << size_ << " (its collective #" << n
                    << " of tag " << tag << "; timeout " << timeout_s_ << " s): " << cause << lost_machines(cause);
    }
  }

  // The other machines, by address, with their ranks: "; lost the machine at
  // 10.0.0.2 (rank 1): no answer", or "" on one machine.
  std::string lost_machines(const std::string& cause) const {
    std::map<std::string, std::string> ranks;  // address -> "1, 3"
    for (int i = 0; i < static_cast<int>(hosts_.size()); ++i)
      if (hosts_[static_cast<size_t>(i)] != hosts_[static_cast<size_t>(rank_)])
        ranks[hosts_[static_cast<size_t>(i)]] += (ranks[hosts_[static_cast<size_t>(i)]].empty() ? "" : ", ") + std::to_string(i);
    if (ranks.empty()) return "";
    auto machine = [&](const std::string& h) {
      return "the machine at " + h + " (rank" + (ranks[h].find(',') == std::string::npos ? " " : "s ") + ranks[h] + ")";
    };
    for (const auto& [h, _] : ranks)  // Gloo names the peer that closed or reset the connection
      if (cause.find("[" + h + "]") != std::string::npos) return "; lost " + machine(h) + ": its connection ended";
    std::vector<std::string> hosts;
    for (const auto& [h, _] : ranks) hosts.push_back(h);
    std::string lost;
    for (const auto& [h, result] : probe_hosts(hosts, probe_s_))
      if (result != "answers") lost += (lost.empty() ? "; lost " : ", ") + machine(h) + ": " + result;
    return lost.empty() ? "; every other machine answers (a rank there is stalled or out of step)" : lost;
  }

  Ms timeout_;
  double probe_s_ = 0;
  std::vector<std::string> hosts_;  // each rank's address
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
  for (int64_t i = 0; i < n; ++i) mine.data<int64_t>()[i + 1] = fields[static_cast<size_t>(i)].value;
  Tensor all = Tensor::empty(Shape{g.size() * (n + 1)}, DType::I64);
  gather(mine, all);
  const int64_t* v = all.data<int64_t>();
  for (int r = 1; r < g.size(); ++r) {
    const int64_t* theirs = v + r * (n + 1);
    FANOUT_USER_CHECK(theirs[0] == n) << "rank " << r << " describes its run with " << theirs[0]
                                      << " fields where rank 0 has " << n << " (every rank must run the same program)";
    for (int64_t i = 0; i < n; ++i) {
      const Agreed& f = fields[static_cast<size_t>(i)];
      const auto show = [&](int64_t x) {
        if (!f.real) return std::to_string(x);
        double d;
        std::memcpy(&d, &x, sizeof d);
        // The shortest form that reads back the same (a float option's as a float: 0.02, not 0.0199999996).
        char buf[64];
        const float f = static_cast<float>(d);
        const auto r = static_cast<double>(f) == d ? std::to_chars(buf, buf + sizeof buf, f)
                                                  : std::to_chars(buf, buf + sizeof buf, d);
        return std::string(buf, r.ptr);
      };
      FANOUT_USER_CHECK(!f.given || theirs[i + 1] == v[i + 1])
          << "rank " << r << (theirs[i + 1] ? " has " : " has no ") << f.name << " where rank 0 has "
          << (v[i + 1] ? "one" : "none") << " (every rank must run the same model and options)";
      FANOUT_USER_CHECK(theirs[i + 1] == v[i + 1])
          << "rank " << r << " has " << f.name << " " << show(theirs[i + 1]) << " where rank 0 has " << show(v[i + 1])
          << " (every rank must run the same model and options)";
    }
  }
}

}  // namespace fanout::distributed
