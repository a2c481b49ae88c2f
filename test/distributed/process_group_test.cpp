// Process group over Gloo with ranks as threads of one test process, meeting
// through a FileStore in a fresh directory: every collective against its
// definition, dtypes, a rank that never joins, a rank that joins after
// Gloo's default timeout, a collective one rank skips, stale files of a dead run.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <string>
#include <thread>

#include "runtime/core/error.h"
#include "runtime/core/half.h"
#include "runtime/distributed/process_group.h"
#include "runtime/distributed/store.h"
#include "support/dist_util.h"
#include "support/test_util.h"

namespace fanout::distributed {
namespace {

using testing::run_ranks;
using testing::TempDir;

TEST(ProcessGroup, CollectivesMatchTheirDefinition) {
  TempDir dir;
  constexpr int kWorld = 3;
  std::vector<std::vector<float>> reduced(kWorld), gathered(kWorld), bcast(kWorld);
  std::vector<std::vector<double>> reduced64(kWorld);
  std::vector<std::vector<int64_t>> reduced_i(kWorld);
  std::vector<float> to_root(1000);
  std::vector<double> to_root64(7);
  run_ranks(kWorld, [&](int r) {
    auto g = make_gloo_group({r, kWorld, "file:" + dir.path(), "t1", 30});
    EXPECT_EQ(g->rank(), r);
    EXPECT_EQ(g->size(), kWorld);
    EXPECT_EQ(g->backend(), "gloo");
    // all-reduce: rank r holds (r + 1) * (i + 0.5) at i.
    Tensor a = Tensor::empty(Shape{1000});
    for (int i = 0; i < 1000; ++i) a.f32()[i] = (r + 1) * (i + 0.5f);
    g->all_reduce(a, "test all-reduce");
    reduced[r].assign(a.f32(), a.f32() + 1000);
    Tensor d = Tensor::empty(Shape{7}, DType::F64);
    for (int i = 0; i < 7; ++i) d.f64()[i] = 1.0 / (r + 1) + i;
    g->all_reduce(d, "test all-reduce f64");
    reduced64[r].assign(d.f64(), d.f64() + 7);
    Tensor n = Tensor::empty(Shape{3}, DType::I64);
    for (int i = 0; i < 3; ++i) n.data<int64_t>()[i] = (int64_t{1} << 40) * (r + 1) + i;
    g->all_reduce(n, "test all-reduce i64");
    reduced_i[r].assign(n.data<int64_t>(), n.data<int64_t>() + 3);
    // broadcast from rank 1.
    Tensor b = Tensor::empty(Shape{5});
    for (int i = 0; i < 5; ++i) b.f32()[i] = 10.0f * r + i;
    g->broadcast(b, 1, "test broadcast");
    bcast[r].assign(b.f32(), b.f32() + 5);
    // all-gather of 2 values per rank.
    Tensor in = Tensor::empty(Shape{2});
    in.f32()[0] = static_cast<float>(r);
    in.f32()[1] = 100.0f + r;
    Tensor out = Tensor::empty(Shape{2 * kWorld});
    g->all_gather(in, out, "test all-gather");
    gathered[r].assign(out.f32(), out.f32() + 2 * kWorld);
    // reduce onto rank 2 (float32) and rank 1 (float64), as all-reduce's inputs.
    for (int i = 0; i < 1000; ++i) a.f32()[i] = (r + 1) * (i + 0.5f);
    g->reduce(a, 2, "test reduce");
    if (r == 2) to_root.assign(a.f32(), a.f32() + 1000);
    for (int i = 0; i < 7; ++i) d.f64()[i] = 1.0 / (r + 1) + i;
    g->reduce(d, 1, "test reduce f64");
    if (r == 1) to_root64.assign(d.f64(), d.f64() + 7);
    g->barrier("test barrier");
  });
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(to_root[i], 6 * (i + 0.5f)) << "reduce, element " << i;
  for (int i = 0; i < 7; ++i) EXPECT_NEAR(to_root64[i], 1.0 + 0.5 + 1.0 / 3 + 3 * i, 1e-12);
  for (int r = 0; r < kWorld; ++r) {
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(reduced[r][i], 6 * (i + 0.5f)) << "rank " << r << " element " << i;
    for (int i = 0; i < 7; ++i) EXPECT_NEAR(reduced64[r][i], 1.0 + 0.5 + 1.0 / 3 + 3 * i, 1e-12);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(reduced_i[r][i], (int64_t{1} << 40) * 6 + 3 * i);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(bcast[r][i], 10.0f + i);
    for (int q = 0; q < kWorld; ++q) {
      EXPECT_EQ(gathered[r][2 * q], static_cast<float>(q));
      EXPECT_EQ(gathered[r][2 * q + 1], 100.0f + q);
    }
  }
}

// bfloat16 sums (--grad-reduce-dtype bf16 on the wire): two ranks' values,
// their sum rounded to nearest even, bit for bit, by all-reduce and by
// reduce; the bytes each rank summed are counted at 2 per element.
TEST(ProcessGroup, Bf16SumsRoundToNearestEven) {
  TempDir dir;
  constexpr int64_t kN = 4099;
  std::vector<std::vector<uint16_t>> in(2, std::vector<uint16_t>(kN));
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (auto& v : in)
    for (auto& h : v) h = half::bf16_from_float(u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4));
  std::vector<std::vector<uint16_t>> all(2), root(2);
  std::vector<int64_t> bytes(2);
  run_ranks(2, [&](int r) {
    auto g = make_gloo_group({r, 2, "file:" + dir.path(), "bf16", 30});
    Tensor t = Tensor::empty(Shape{kN}, DType::BF16);
    std::copy(in[r].begin(), in[r].end(), t.data<uint16_t>());
    g->all_reduce(t, "test all-reduce bf16");
    all[r].assign(t.data<uint16_t>(), t.data<uint16_t>() + kN);
    std::copy(in[r].begin(), in[r].end(), t.data<uint16_t>());
    g->reduce(t, 1, "test reduce bf16");
    root[r].assign(t.data<uint16_t>(), t.data<uint16_t>() + kN);
    bytes[r] = g->summed_bytes();
  });
  for (int64_t i = 0; i < kN; ++i) {
    const uint16_t want = half::bf16_from_float(half::float_from_bf16(in[0][i]) + half::float_from_bf16(in[1][i]));
    ASSERT_EQ(all[0][i], want) << "all-reduce, element " << i;
    ASSERT_EQ(all[1][i], want) << "all-reduce, element " << i;
    ASSERT_EQ(root[1][i], want) << "reduce, element " << i;
  }
  EXPECT_EQ(bytes[0], 2 * 2 * kN);
  EXPECT_EQ(bytes[1], 2 * 2 * kN);
}

TEST(ProcessGroup, WorldOfOneNeedsNoPeers) {
  TempDir dir;
  auto g = make_gloo_group({0, 1, "file:" + dir.path(), "solo", 5});
  Tensor a = Tensor::empty(Shape{3});
  a.fill(2.0f);
  g->all_reduce(a, "solo all-reduce");
  EXPECT_EQ(a.f32()[2], 2.0f);
  Tensor out = Tensor::empty(Shape{3});
  g->all_gather(a, out, "solo all-gather");
  EXPECT_EQ(out.f32()[1], 2.0f);
  g->barrier("solo barrier");
}

// The error names the rank that never came and the wait it gave up after
// (the group's timeout, not Gloo's default); the only clock in the test is an outer "did not hang"
// bound, 30x the timeout.
TEST(ProcessGroup, RankThatNeverJoinsIsAnErrorAfterTheTimeout) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  testing::expect_user_error([&] { make_gloo_group({0, 2, "file:" + dir.path(), "lonely", 1.0}); },
                             {"rendezvous over file:", "(rank 0 of 2): rank 1 did not join within 1 s"});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 30.0) << "hung";
}

// --timeout longer than Gloo's own 30 s default holds for every wait of the
// rendezvous: rank 1 is held back (the test's hook: its thread starts late)
// for 32 s, past that default, and both ranks still meet and all-reduce.
TEST(ProcessGroup, TimeoutLongerThanGloosDefaultHoldsForTheRendezvous) {
  TempDir dir;
  std::vector<float> got(2);
  run_ranks(2, [&](int r) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::seconds(32));
    auto g = make_gloo_group({r, 2, "file:" + dir.path(), "late", 120});
    Tensor a = Tensor::empty(Shape{1});
    a.f32()[0] = r + 1.0f;
    g->all_reduce(a, "all-reduce after a late join");
    got[r] = a.f32()[0];
  });
  EXPECT_EQ(got[0], 3.0f);
  EXPECT_EQ(got[1], 3.0f);
}

// A collective that one rank never enters: the other's ends with an error
// naming it, its rank and the timeout. Rank 1 is held at a known point (it
// waits for rank 0's failure before it leaves), so no clock decides it.
TEST(ProcessGroup, CollectiveThatOneRankSkipsFailsAfterTheTimeout) {
  TempDir dir;
  std::promise<std::string> failed;
  auto rank0_failed = failed.get_future().share();
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(2, [&](int r) {
    auto g = make_gloo_group({r, 2, "file:" + dir.path(), "skip", 1.0});
    g->barrier("both joined");
    if (r == 1) {
      rank0_failed.wait();  // never enters the all-reduce
      return;
    }
    Tensor a = Tensor::empty(Shape{4});
    a.fill(1.0f);
    try {
      g->all_reduce(a, "all-reduce of bucket 3");
      failed.set_value("");
    } catch (const Error& e) {
      failed.set_value(e.what());
    }
  });
  const std::string err = rank0_failed.get();
  for (const char* part : {"all-reduce of bucket 3", "failed on rank 0 of 2", "timeout 1 s", "its collective #"})
    EXPECT_NE(err.find(part), std::string::npos) << part << " not in: " << err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0) << "hung";
}

TEST(ProcessGroup, StaleFilesOfADeadRunDoNotDisturbANewOne) {
  TempDir dir;
  // A rank whose meeting times out removes the keys it wrote: a retry with its id meets no stale address.
  try {
    make_gloo_group({0, 2, "file:" + dir.path(), "dead-run", 0.5});
    ADD_FAILURE() << "a world of 2 met with one rank";
  } catch (const Error&) {
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  // A run killed inside its meeting leaves its rank-0 address behind under its run id.
  const std::string stale = "127.0.0.1";
  open_store(Rendezvous::parse("file:" + dir.path()), "dead-run", 1)->set("host/0", {stale.begin(), stale.end()});
  ASSERT_FALSE(std::filesystem::is_empty(dir.path()));
  std::vector<float> got(2);
  run_ranks(2, [&](int r) {
    auto g = make_gloo_group({r, 2, "file:" + dir.path(), "new-run", 30});
    Tensor a = Tensor::empty(Shape{1});
    a.f32()[0] = r + 1.0f;
    g->all_reduce(a, "all-reduce after a dead run");
    got[r] = a.f32()[0];
  });
  EXPECT_EQ(got[0], 3.0f);
  EXPECT_EQ(got[1], 3.0f);
}

TEST(ProcessGroup, RendezvousSpecs) {
  EXPECT_EQ(Rendezvous::parse("file:/tmp/x").path, "/tmp/x");
  const Rendezvous r = Rendezvous::parse("redis:127.0.0.1:6390");
  EXPECT_EQ(r.host, "127.0.0.1");
  EXPECT_EQ(r.port, 6390);
  EXPECT_EQ(r.str(), "redis:127.0.0.1:6390");
  testing::expect_user_error([] { Rendezvous::parse("tcp:1.2.3.4"); }, {"bad rendezvous 'tcp:1.2.3.4'"});
  testing::expect_user_error([] { Rendezvous::parse("file:"); }, {"file:DIR"});
  testing::expect_user_error([] { Rendezvous::parse("redis:host"); }, {"redis:HOST:PORT"});
  testing::expect_user_error([] { Rendezvous::parse("redis:host:0"); }, {"1..65535"});
  testing::expect_user_error([] { Rendezvous::parse("redis:host:99999"); }, {"1..65535"});
  testing::expect_user_error([] { probe_rendezvous(Rendezvous::parse("redis:127.0.0.1:1"), 2); },
                             {"cannot reach the Redis rendezvous at 127.0.0.1:1"});
}

TEST(ProcessGroup, RedisPasswordComesFromTheEnvironmentAndIsNeverPrinted) {
  ::setenv("FANOUT_RDZV_PASSWORD", "s3cret-pw", 1);
  const Rendezvous r = Rendezvous::parse("redis:127.0.0.1:6390");
  const Rendezvous f = Rendezvous::parse("file:/tmp/x");
  ::unsetenv("FANOUT_RDZV_PASSWORD");
  EXPECT_EQ(r.password, "s3cret-pw");
  EXPECT_EQ(r.str().find("s3cret"), std::string::npos);
  EXPECT_TRUE(f.password.empty());
  EXPECT_TRUE(Rendezvous::parse("redis:127.0.0.1:6390").password.empty());

  const testing::TempDir tmp;
  const std::string dir = tmp.path(), path = dir + "/pw";
  { std::ofstream(path) << "line-one\r\nline-two\n"; }
  read_rdzv_password(path);
  EXPECT_STREQ(std::getenv("FANOUT_RDZV_PASSWORD"), "line-one");
  ::unsetenv("FANOUT_RDZV_PASSWORD");
  { std::ofstream(path) << "\n"; }
  testing::expect_user_error([&] { read_rdzv_password(path); }, {"--rdzv-password-file", "is empty"});
  testing::expect_user_error([&] { read_rdzv_password(dir + "/none"); }, {"cannot read --rdzv-password-file"});
  EXPECT_EQ(std::getenv("FANOUT_RDZV_PASSWORD"), nullptr);
}

TEST(ProcessGroup, InterfacesAndRoutes) {
  EXPECT_EQ(interface_address("lo"), "127.0.0.1");
  testing::expect_user_error([] { interface_address("nope0"); }, {"no network interface 'nope0'"});
  EXPECT_EQ(route_address("127.0.0.1", 6379), "127.0.0.1");
  EXPECT_EQ(route_address("no-such-host.invalid", 6379), "");
  ::unsetenv("GLOO_SOCKET_IFNAME");
  use_interface("lo");
  EXPECT_STREQ(std::getenv("GLOO_SOCKET_IFNAME"), "lo");
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "lo");
  ::unsetenv("GLOO_SOCKET_IFNAME");
  ::unsetenv("NCCL_SOCKET_IFNAME");
  testing::expect_user_error([] { use_interface("nope0"); }, {"no network interface 'nope0'"});
  EXPECT_EQ(std::getenv("GLOO_SOCKET_IFNAME"), nullptr);
}

TEST(ProcessGroup, ProbedHostsAnswerEvenWhenTheyRefuse) {
  // 127.0.0.1 refuses port 9 at once: the machine is there. The kernel takes no TCP to the
  // broadcast address: the error is the result. (Silent machines: e2e.machines_faults.)
  const auto got = probe_hosts({"127.0.0.1", "255.255.255.255", "not-an-address"}, 0.3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], std::make_pair(std::string("127.0.0.1"), std::string("answers")));
  EXPECT_EQ(got[1], std::make_pair(std::string("255.255.255.255"), std::string("Network is unreachable")));
  EXPECT_EQ(got[2].second, "answers");  // no claim about what cannot be probed
}

}  // namespace
}  // namespace fanout::distributed
