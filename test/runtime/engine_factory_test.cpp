// Engine factory helpers: what --devices auto picks, how device lists split
// over processes, and the peak-memory readings the epoch summary reports.
#include <gtest/gtest.h>

#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/core/tensor.h"
#include "runtime/parallel/engine_factory.h"

namespace fanout {
namespace {

TEST(AutoDevices, EveryGpuWhenThereIsOne) {
  const AutoDevices a = auto_devices(32, 16, 2);
  EXPECT_EQ(a.spec, "all");
  EXPECT_NE(a.why.find("GPU"), std::string::npos);
}

TEST(AutoDevices, OneCpuReplicaPerCoreWhileEachGetsSixteenRows) {
  EXPECT_EQ(auto_devices(32, 2, 0).spec, "cpu:2");    // the README's command on a 2-core machine
  EXPECT_EQ(auto_devices(256, 8, 0).spec, "cpu:8");
  EXPECT_EQ(auto_devices(32, 16, 0).spec, "cpu:2");   // 16 rows each at most two ways
  EXPECT_EQ(auto_devices(100, 16, 0).spec, "cpu:6");
  EXPECT_EQ(auto_devices(16, 8, 0).spec, "cpu");      // too small a batch to share
  EXPECT_EQ(auto_devices(1024, 1, 0).spec, "cpu");    // one core
  const AutoDevices a = auto_devices(32, 2, 0);
  EXPECT_NE(a.why.find("2 CPU replicas"), std::string::npos) << a.why;
  EXPECT_NE(a.why.find("--devices cpu"), std::string::npos) << a.why;
  // Whatever it picks parses.
  for (int cores : {1, 2, 3, 64})
    for (int64_t batch : {1, 15, 16, 33, 4096}) EXPECT_NO_THROW(parse_devices(auto_devices(batch, cores, 0).spec));
}

TEST(SplitDevices, EvenSplitsRenumberCpusAndOddOnesAreOneLine) {
  const auto all = parse_devices("cpu:4");
  const auto second = split_devices(all, 2, 1);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].str(), "cpu:0");
  EXPECT_EQ(second[1].str(), "cpu:1");
  EXPECT_THROW(split_devices(parse_devices("cpu:3"), 2, 0), Error);
}

TEST(PeakMemory, HostPeakCoversWhatWasTouched) {
  const size_t before = peak_host_bytes();
  EXPECT_GT(before, 0u);
  {
    std::vector<char> block(before + (64 << 20), 1);  // touch more than the peak so far
    volatile char sink = block[block.size() / 2];
    (void)sink;
  }
  EXPECT_GE(peak_host_bytes(), before + (64 << 20));
}

TEST(PeakMemory, CpuDevicesCountTheirOwnAllocations) {
  const Device d = Device::cpu(7), other = Device::cpu(6);
  reset_device_peak_bytes(d);
  const size_t live = cpu_device_live_bytes(d), other_peak = device_peak_bytes(other);
  EXPECT_EQ(device_peak_bytes(d), live);
  {
    Tensor a = Tensor::empty(Shape{1000}, DType::F32, d);
    Tensor b = Tensor::empty(Shape{500}, DType::F64, d);
    EXPECT_EQ(cpu_device_live_bytes(d), live + 8000);
  }
  Tensor c = Tensor::empty(Shape{100}, DType::F32, d);
  EXPECT_EQ(cpu_device_live_bytes(d), live + 400);
  EXPECT_EQ(device_peak_bytes(d), live + 8000);  // a and b at once
  EXPECT_EQ(device_peak_bytes(other), other_peak);
  reset_device_peak_bytes(d);
  EXPECT_EQ(device_peak_bytes(d), live + 400);  // the mark restarts from what is live
}

}  // namespace
}  // namespace fanout
