// Device-list parsing and the core tensor operations.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/core/memory.h"
#include "runtime/core/tensor.h"
#include "support/test_util.h"

namespace fanout {
namespace {

TEST(Devices, CpuForms) {
  auto one = parse_devices("cpu");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_TRUE(one[0].is_cpu());
  auto four = parse_devices("cpu:4");
  ASSERT_EQ(four.size(), 4u);
  EXPECT_EQ(four[3], Device::cpu(3));
  EXPECT_EQ(four[2].str(), "cpu:2");
}

// "auto" as in dp-train: every visible GPU, else one CPU replica per core.
TEST(Devices, AutoIsTheGpusOrOneCpuReplicaPerCore) {
  const auto d = parse_devices("auto");
  if (cuda_device_count() > 0 && cuda_available_in_build()) {
    EXPECT_EQ(d, parse_devices("all"));
    return;
  }
  const int cores = host_cores();
  ASSERT_EQ(d.size(), static_cast<size_t>(cores));
  for (int i = 0; i < cores; ++i) EXPECT_EQ(d[i], Device::cpu(i));
}

TEST(Devices, BadForms) {
  for (const char* bad : {"", "cpu:0", "cpu:x", "gpu", "cuda:", "0,cpu", "-1", "1,,2", "cpu:100000"})
    EXPECT_THROW(parse_devices(bad), Error) << bad;
  // Each says what is wrong with it.
  EXPECT_NE(testing::error_of([] { parse_devices("cpu:0"); }).find("torch's cpu:0 is cpu here"), std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_devices("cpu:0,cpu:1"); }).find("not in a list"), std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_devices("all,cpu"); }).find("all stands alone, not in a list"),
            std::string::npos);
  EXPECT_EQ(testing::error_of([] { parse_devices("cpu;2"); }),
            "unknown device 'cpu;2' (expected cpu, cpu:N, all, N or cuda:N)");
}

// The cores a process may run on are its affinity mask's (taskset, a cpuset), not the machine's.
TEST(Devices, CoresAreTheAffinityMasks) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "one core to run on";
  EXPECT_EQ(host_cores(), CPU_COUNT(&all));
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const int cores = host_cores();
  const std::vector<Device> d = parse_devices("auto");
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(cores, 1);
  if (cuda_device_count() == 0) EXPECT_EQ(d, std::vector<Device>{Device::cpu(0)});
}

TEST(Devices, CudaWithoutGpuIsOneClearLine) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  try {
    parse_devices("cuda:0");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos);
    EXPECT_NE(msg.find("cuda:0"), std::string::npos);
  }
}

TEST(Memory, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(uint64_t{3} << 30), "3.0 GiB");
  EXPECT_EQ(format_bytes(uint64_t{10239795201024}), "9.3 TiB");
  EXPECT_EQ(format_bytes(~uint64_t{0}), "16.0 EiB");
}

// Sanitizers abort on an allocation this large instead of returning null.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
TEST(Memory, OutOfHostMemoryIsOneLineSayingHowMuch) {
  try {
    Tensor::empty(Shape{int64_t{1} << 42, 1024});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    // Checked against MemAvailable before the allocator is asked (no OOM killer later).
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("out of host memory: cannot allocate 16.0 PiB (", 0), 0u) << what;
    EXPECT_TRUE(what.ends_with(" available)")) << what;
  }
}
#endif

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros(Shape{4, 3});
  for (int i = 0; i < 12; ++i) t.f32()[i] = float(i);
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.f32()[0], 3.0f);
  Tensor f = t.flat(5, Shape{2});
  f.f32()[0] = -1;
  EXPECT_EQ(t.f32()[5], -1.0f);
  EXPECT_THROW(t.view(Shape{5}), Error);
  EXPECT_THROW(t.slice(2, 5), Error);
}

TEST(Tensor, EnsureReusesLargerStorage) {
  Tensor t;
  ensure(t, Shape{8, 4}, Device::cpu());
  const void* p = t.raw();
  const auto before = alloc_stats().host_allocs;
  ensure(t, Shape{3, 4}, Device::cpu());
  ensure(t, Shape{8, 4}, Device::cpu());
  EXPECT_EQ(t.raw(), p);
  EXPECT_EQ(alloc_stats().host_allocs, before);
}

TEST(Tensor, ChannelsLastKeepsTheLogicalShape) {
  const Shape s{2, 3, 4, 5};
  Tensor t = Tensor::empty(s, DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast);
  EXPECT_TRUE(t.channels_last());
  EXPECT_EQ(t.shape(), s);
  EXPECT_EQ(t.nbytes(), size_t{2 * 3 * 4 * 5 * 2});
  EXPECT_NO_THROW(t.view(s));
  EXPECT_THROW(t.view(Shape{2, 60}), Error);  // the memory order is not the logical one
  EXPECT_THROW(t.flat(0, Shape{4}), Error);
  const Tensor row = t.slice(1, 2);  // a batch row is one run of memory
  EXPECT_TRUE(row.channels_last());
  EXPECT_EQ(static_cast<const char*>(row.raw()) - static_cast<const char*>(t.raw()), 3 * 4 * 5 * 2);
  EXPECT_TRUE(t.to(Device::cpu()).channels_last());
  Tensor contiguous = Tensor::empty(s, DType::BF16);
  EXPECT_THROW(contiguous.copy_from(t), Error);
  EXPECT_THROW(Tensor::empty(Shape{2, 3, 4}, DType::F32, Device::cpu(), MemoryFormat::ChannelsLast), Error);
  EXPECT_FALSE(t.as(Shape{120}, DType::BF16).channels_last());
  // ensure keeps a buffer across formats: its bytes do not change.
  Tensor e;
  ensure(e, s, DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast);
  const void* p = e.raw();
  ensure(e, Shape{1, 3, 4, 5}, DType::BF16, Device::cpu());
  EXPECT_EQ(e.raw(), p);
  EXPECT_FALSE(e.channels_last());
  ensure(e, s, DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast);
  EXPECT_EQ(e.raw(), p);
  EXPECT_TRUE(e.channels_last());
}

// Shapes past int64 are one-line errors, not wrapped sizes (a 2^62-row
// tensor once got a 16-byte buffer); dimensions index from either end, as
// torch's size(-1), and an index outside is an error, not a read past.
TEST(Tensor, ShapesPastInt64AndBadDimensionsAreErrors) {
  const int64_t big = (int64_t{1} << 62) + 1;
  testing::expect_user_error([&] { Tensor::zeros(Shape{big, 4}); },
                             {"shape (4611686018427387905, 4) has more elements than fit in 64 bits"});
  testing::expect_user_error([&] { Shape{int64_t{1} << 40, int64_t{1} << 24}.numel(); }, {"more elements than fit"});
  testing::expect_user_error([&] { Tensor::empty(Shape{big}, DType::I32); },
                             {"int32 tensor of shape (4611686018427387905) has more bytes than fit in 64 bits"});
  EXPECT_EQ((Shape{3, int64_t{1} << 40}).numel(), int64_t{3} << 40);
  EXPECT_EQ((Shape{int64_t{1} << 40, int64_t{1} << 40, 0}).numel(), 0) << "empty, whatever else";
  const Tensor t = Tensor::zeros(Shape{2, 3});
  EXPECT_EQ(t.size(1), 3);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.size(-2), 2);
  testing::expect_user_error([&] { t.size(2); }, {"dimension 2 is out of range for the 2-dim shape (2, 3) (expected [-2, 1])"});
  testing::expect_user_error([&] { t.size(-3); }, {"dimension -3 is out of range"});
  Shape s{2, 3};
  testing::expect_user_error([&] { s[7] = 1; }, {"dimension 7 is out of range"});
  if (cuda_available_in_build()) {  // a GPU index past the visible ones
    const int n = cuda_device_count();
    testing::expect_user_error([&] { Tensor::empty(Shape{4}, DType::F32, Device::cuda(n)); },
                               {"cuda:" + std::to_string(n) + " is not a visible CUDA device (" + std::to_string(n) + " visible)"});
  }
}

TEST(Tensor, CheckMessageCarriesExpressionAndLocation) {
  try {
    FANOUT_CHECK(1 + 1 == 3) << "arithmetic";
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("1 + 1 == 3"), std::string::npos);
    EXPECT_NE(m.find("device_test.cpp"), std::string::npos);
    EXPECT_NE(m.find("arithmetic"), std::string::npos);
  }
}

}  // namespace
}  // namespace fanout
