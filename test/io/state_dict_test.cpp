// load_state_dict / state_dict_cpu on a tiny module tree: round trip through
// a safetensors file, strict refusals that change nothing, non-strict partial
// loads, the "module." prefix, and integer buffers.
#include "runtime/io/state_dict.h"

#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "runtime/core/error.h"
#include "runtime/io/safetensors.h"
#include "support/test_util.h"

namespace fanout::io {
namespace {

// A layer with a weight and a bias; forward/backward are not exercised here.
class TinyLinear : public Module {
 public:
  TinyLinear(int64_t in, int64_t out) : in_(in), out_(out) {
    register_parameter("weight", Shape{out, in});
    register_parameter("bias", Shape{out});
  }
  Tensor forward(const Tensor& x, Context&) override { return x; }
  Tensor backward(const Tensor& dy, Context&) override { return dy; }
  std::unique_ptr<Module> make_like() const override { return std::make_unique<TinyLinear>(in_, out_); }
  std::string type_name() const override { return "TinyLinear"; }

 private:
  int64_t in_, out_;
};

// weight (4, 3); running_mean (4) F32 buffer; num_batches_tracked () I64 buffer; fc child.
class TinyNet : public Module {
 public:
  TinyNet() {
    register_parameter("weight", Shape{4, 3});
    register_buffer("running_mean", Shape{4});
    register_buffer("num_batches_tracked", Shape{}, DType::I64);
    register_module("fc", std::make_unique<TinyLinear>(3, 2));
  }
  Tensor forward(const Tensor& x, Context&) override { return x; }
  Tensor backward(const Tensor& dy, Context&) override { return dy; }
  std::unique_ptr<Module> make_like() const override { return std::make_unique<TinyNet>(); }
  std::string type_name() const override { return "TinyNet"; }
};

const std::vector<std::string> kNames = {"weight", "running_mean", "num_batches_tracked", "fc.weight", "fc.bias"};

// Materialized on the CPU with random floats and a large counter.
std::unique_ptr<TinyNet> random_net(uint64_t seed) {
  auto m = std::make_unique<TinyNet>();
  m->materialize(Device::cpu());
  std::mt19937_64 rng(seed);
  for (auto& [name, t] : m->state_dict()) {
    if (t.dtype() == DType::F32) {
      t.copy_from(testing::random_tensor(t.shape(), rng));
    } else {
      t.data<int64_t>()[0] = 5'000'000'000 + static_cast<int64_t>(seed);
    }
  }
  return m;
}

std::unique_ptr<TinyNet> zero_net() {
  auto m = std::make_unique<TinyNet>();
  m->materialize(Device::cpu());
  return m;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

bool all_zero(Module& m) {
  for (auto& [n, t] : m.state_dict()) {
    const auto* p = static_cast<const uint8_t*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i)
      if (p[i]) return false;
  }
  return true;
}

Tensor find(Module& m, const std::string& name) {
  for (auto& [n, t] : m.state_dict())
    if (n == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

using testing::error_of;

TEST(StateDict, NamesFollowTheModuleTree) {
  auto m = random_net(1);
  auto sd = state_dict_cpu(*m);
  ASSERT_EQ(sd.size(), kNames.size());
  for (size_t i = 0; i < kNames.size(); ++i) EXPECT_EQ(sd[i].first, kNames[i]);
  EXPECT_EQ(sd[2].second.dtype(), DType::I64);
  EXPECT_EQ(sd[2].second.dim(), 0);
}

TEST(StateDict, CpuCopiesAreCopies) {
  auto m = random_net(2);
  auto sd = state_dict_cpu(*m);
  const float before = find(*m, "fc.bias").f32()[0];
  sd[4].second.f32()[0] = before + 1.0f;
  sd[2].second.data<int64_t>()[0] = -1;
  EXPECT_EQ(find(*m, "fc.bias").f32()[0], before);
  EXPECT_EQ(find(*m, "num_batches_tracked").data<int64_t>()[0], 5'000'000'002);
}

TEST(StateDict, RoundTripThroughAFileIsBitExact) {
  const auto dir = std::filesystem::temp_directory_path() / ("fanout_sd_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "net.safetensors").string();
  auto a = random_net(3);
  save_safetensors(path, a->state_dict(), {{"epoch", "7"}});
  TensorFile f = load_safetensors(path);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(f.metadata.at("epoch"), "7");

  auto b = zero_net();
  LoadReport r = load_state_dict(*b, f.tensors, /*strict=*/true);
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.summary(), "all tensors matched");
  auto sa = a->state_dict(), sb = b->state_dict();
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(same_bytes(sa[i].second, sb[i].second)) << sa[i].first;
}

TEST(StateDict, StrictRefusesBeforeChangingAnything) {
  auto src = state_dict_cpu(*random_net(4));
  auto b = zero_net();

  auto missing = src;
  missing.erase(missing.begin() + 1);  // running_mean
  std::string msg = error_of([&] { load_state_dict(*b, missing, true); });
  EXPECT_NE(msg.find("1 missing (running_mean)"), std::string::npos) << msg;
  EXPECT_TRUE(all_zero(*b));

  auto unexpected = src;
  unexpected.emplace_back("fc2.weight", Tensor::zeros(Shape{1}));
  msg = error_of([&] { load_state_dict(*b, unexpected, true); });
  EXPECT_NE(msg.find("1 unexpected (fc2.weight)"), std::string::npos) << msg;
  EXPECT_TRUE(all_zero(*b));

  auto mismatched = src;
  mismatched[0].second = Tensor::zeros(Shape{3, 4});
  msg = error_of([&] { load_state_dict(*b, mismatched, true); });
  EXPECT_NE(msg.find("1 mismatched (weight: file (3, 4) vs model (4, 3))"), std::string::npos) << msg;
  EXPECT_TRUE(all_zero(*b));

  // All three at once, in one message.
  auto all = mismatched;
  all.erase(all.begin() + 1);
  all.emplace_back("extra", Tensor::zeros(Shape{1}));
  msg = error_of([&] { load_state_dict(*b, all, true); });
  EXPECT_NE(msg.find("missing (running_mean)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected (extra)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mismatched (weight"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_TRUE(all_zero(*b));
}

TEST(StateDict, NonStrictLoadsWhatFits) {
  auto a = random_net(5);
  auto src = state_dict_cpu(*a);
  src[0].second = Tensor::zeros(Shape{4, 4});                   // weight: wrong shape
  src.erase(src.begin() + 3);                                   // fc.weight: missing
  src.emplace_back("head.bias", Tensor::zeros(Shape{2}));       // unexpected
  auto b = zero_net();
  LoadReport r = load_state_dict(*b, src, /*strict=*/false);
  EXPECT_EQ(r.missing, std::vector<std::string>{"fc.weight"});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"head.bias"});
  EXPECT_EQ(r.mismatched, std::vector<std::string>{"weight: file (4, 4) vs model (4, 3)"});
  EXPECT_EQ(r.summary(), "1 missing (fc.weight); 1 unexpected (head.bias); 1 mismatched (weight: file (4, 4) vs model (4, 3))");
  for (const char* n : {"running_mean", "num_batches_tracked", "fc.bias"})
    EXPECT_TRUE(same_bytes(find(*a, n), find(*b, n))) << n;
  for (const char* n : {"weight", "fc.weight"}) {
    Tensor t = find(*b, n);
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.f32()[i], 0.0f) << n;
  }
}

TEST(StateDict, DataParallelPrefixIsStripped) {
  auto a = random_net(6);
  auto src = state_dict_cpu(*a);
  for (auto& [n, t] : src) n = "module." + n;
  auto b = zero_net();
  EXPECT_TRUE(load_state_dict(*b, src, true).ok());
  for (const auto& n : kNames) EXPECT_TRUE(same_bytes(find(*a, n), find(*b, n))) << n;

  // Only a leading "module." goes; "fc.module.x" would stay as it is.
  src[0].first = "xmodule.weight";
  LoadReport r = load_state_dict(*b, src, false);
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"xmodule.weight"});
  EXPECT_EQ(r.missing, std::vector<std::string>{"weight"});

  // The same tensor twice (with and without the prefix) is an error.
  auto dup = state_dict_cpu(*a);
  dup.emplace_back("module.fc.bias", dup[4].second);
  EXPECT_THROW(load_state_dict(*b, dup, false), Error);
}

TEST(StateDict, DtypesMustMatchExceptIntegerCounters) {
  auto b = zero_net();
  auto src = state_dict_cpu(*random_net(7));

  // num_batches_tracked stored as int32 (some exporters do): converted.
  auto i32 = src;
  Tensor c = Tensor::empty(Shape{}, DType::I32);
  c.data<int32_t>()[0] = 42;
  i32[2].second = c;
  ASSERT_TRUE(load_state_dict(*b, i32, true).ok());
  EXPECT_EQ(find(*b, "num_batches_tracked").data<int64_t>()[0], 42);

  // A float where the counter is, or an int where a float parameter is: mismatched.
  auto f32 = src;
  f32[2].second = Tensor::zeros(Shape{});
  std::string msg = error_of([&] { load_state_dict(*b, f32, true); });
  EXPECT_NE(msg.find("num_batches_tracked: file float32 () vs model int64 ()"), std::string::npos) << msg;
  auto i64w = src;
  i64w[4].second = Tensor::zeros(Shape{2}, DType::I64);
  msg = error_of([&] { load_state_dict(*b, i64w, true); });
  EXPECT_NE(msg.find("fc.bias: file int64 (2) vs model float32 (2)"), std::string::npos) << msg;
  EXPECT_EQ(find(*b, "num_batches_tracked").data<int64_t>()[0], 42) << "strict refusal changed nothing";
}

// A file without num_batches_tracked (torchvision's ImageNet weights, torch's files from before the
// counter): strict loading takes it, keeping the model's counter, as torch's BatchNorm does.
TEST(StateDict, AMissingNumBatchesTrackedKeepsTheModels) {
  auto b = zero_net();
  find(*b, "num_batches_tracked").data<int64_t>()[0] = 9;
  auto src = state_dict_cpu(*random_net(8));
  std::vector<std::pair<std::string, Tensor>> without;
  for (auto& [n, t] : src)
    if (n != "num_batches_tracked") without.emplace_back(n, t);
  ASSERT_EQ(without.size() + 1, src.size());
  const LoadReport r = load_state_dict(*b, without, true);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.kept, std::vector<std::string>{"num_batches_tracked"});
  EXPECT_EQ(r.summary(), "all tensors matched (1 num_batches_tracked not in the file kept, as torch's)");
  EXPECT_EQ(find(*b, "num_batches_tracked").data<int64_t>()[0], 9);
  EXPECT_TRUE(same_bytes(find(*b, "fc.bias"), find(*random_net(8), "fc.bias")));
  // Any other tensor missing is still an error.
  without.pop_back();
  EXPECT_NE(error_of([&] { load_state_dict(*b, without, true); }).find("1 missing"), std::string::npos);
}

// Half, bfloat16 and double values load into float32 parameters as torch's
// load_state_dict copies them: widened exactly, or rounded to nearest.
TEST(StateDict, FloatTensorsOfOtherWidthsAreConverted) {
  auto src = state_dict_cpu(*random_net(7));
  const auto bias_after = [&](Tensor t) {
    auto b = zero_net();
    auto f = src;
    f[4].second = std::move(t);  // fc.bias, (2)
    EXPECT_TRUE(load_state_dict(*b, f, true).ok());
    const Tensor& got = find(*b, "fc.bias");
    return std::pair<float, float>{got.f32()[0], got.f32()[1]};
  };
  Tensor h = Tensor::empty(Shape{2}, DType::F16);
  h.data<uint16_t>()[0] = 0xC080;  // -2.25
  h.data<uint16_t>()[1] = 0x0001;  // 2^-24, the smallest subnormal
  EXPECT_EQ(bias_after(h), std::make_pair(-2.25f, std::ldexp(1.0f, -24)));
  Tensor bf = Tensor::empty(Shape{2}, DType::BF16);
  bf.data<uint16_t>()[0] = 0x3FC0;  // 1.5
  bf.data<uint16_t>()[1] = 0xC2F7;  // -123.5
  EXPECT_EQ(bias_after(bf), std::make_pair(1.5f, -123.5f));
  Tensor d = Tensor::empty(Shape{2}, DType::F64);
  d.f64()[0] = 0.1;
  d.f64()[1] = 1e-50;  // below float's range: 0
  EXPECT_EQ(bias_after(d), std::make_pair(static_cast<float>(0.1), 0.0f));
  d.f64()[1] = 1e300;  // finite, but no float
  auto b = zero_net();
  auto f = src;
  f[4].second = d;
  testing::expect_user_error([&] { load_state_dict(*b, f, true); }, {"fc.bias holds 1e+300, beyond float32's range"});
}

TEST(StateDict, SummaryCutsLongLists) {
  LoadReport r;
  for (int i = 0; i < 8; ++i) r.missing.push_back("m" + std::to_string(i));
  r.unexpected = {"u0"};
  EXPECT_EQ(r.summary(), "8 missing (m0, m1, m2, m3, m4, and 3 more); 1 unexpected (u0)");
  EXPECT_FALSE(r.ok());
}

TEST(StateDict, StrictErrorForManyMissingIsShort) {
  auto b = zero_net();
  std::vector<std::pair<std::string, Tensor>> src;
  for (int i = 0; i < 50; ++i) src.emplace_back("x" + std::to_string(i), Tensor::zeros(Shape{1}));
  std::string msg = error_of([&] { load_state_dict(*b, src, true); });
  EXPECT_NE(msg.find("50 unexpected (x0, x1, x2, x3, x4, and 45 more)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("5 missing"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fanout::io
