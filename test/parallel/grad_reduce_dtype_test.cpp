// --grad-reduce-dtype bf16: DataParallel over cpu:2 rounds each replica's
// bucket to bfloat16 before the reduction and the sum after, so the
// primary's gradient is round(round(g0) + round(g1)) of the two chunks'
// gradients (computed here on one device each); float32 reduction leaves
// them unrounded. Bad reduce types are one-line errors.
#include <gtest/gtest.h>

#include "models/zoo/zoo.h"
#include "runtime/core/half.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/single_device.h"
#include "support/test_util.h"

namespace fanout {
namespace {

float bf16(float v) { return half::float_from_bf16(half::bf16_from_float(v)); }

// The gradient one device computes for rows [begin, end) of the batch, each row's loss gradient scaled by 1/rows.
Tensor chunk_grad(const Tensor& init, const Shape& sample, const Tensor& x, const Tensor& y, int64_t begin,
                  int64_t end) {
  auto m = models::make_model("lenet", sample, 10, 3);
  m->arenas().params.copy_from(init);
  // The threads of each of DataParallel's two replicas: oneDNN's sums follow the thread count.
  SingleDeviceEngine e(*m, Device::cpu(), *make_criterion({}), 1, with_cpu_threads({}, 2));
  e.forward_backward(x.slice(begin, end), y.slice(begin, end), 1.0f / static_cast<float>(x.size(0)), true);
  return m->arenas().grads.to(Device::cpu());
}

TEST(GradReduceDtype, Bf16RoundsEachReplicasBucketAndTheSum) {
  const Shape sample{1, 28, 28};
  auto batches = testing::random_batches(sample, 10, 1, 4);
  const Tensor &x = batches[0].x, &y = batches[0].y;
  for (DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    auto m = models::make_model("lenet", sample, 10, 3);
    const Tensor init = m->arenas().params.to(Device::cpu());
    DataParallelOptions o;
    o.grad_reduce_dtype = t;
    DataParallelEngine dp(*m, parse_devices("cpu:2"), *make_criterion({}), o);
    dp.forward_backward_batch(x, y);
    const Tensor g0 = chunk_grad(init, sample, x, y, 0, 5), g1 = chunk_grad(init, sample, x, y, 5, 10);
    const Tensor& got = m->arenas().grads;
    int64_t differ_from_f32 = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const float a = g0.f32()[i], b = g1.f32()[i];
      const float want = t == DType::BF16 ? bf16(bf16(a) + bf16(b)) : a + b;
      ASSERT_EQ(got.f32()[i], want) << "element " << i;
      differ_from_f32 += want != a + b;
    }
    if (t == DType::BF16) EXPECT_GT(differ_from_f32, got.numel() / 2) << "bfloat16 rounds most elements";
  }
}

TEST(GradReduceDtype, BadTypesAreOneLineErrors) {
  EXPECT_EQ(parse_grad_reduce_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_grad_reduce_dtype("fp32"), DType::F32);
  testing::expect_user_error([] { parse_grad_reduce_dtype("fp16"); }, {"cannot be reduced in 'fp16'", "fp32 or bf16"});
  testing::expect_user_error([] { parse_grad_reduce_dtype("int8"); }, {"cannot be reduced in 'int8'"});
  auto m = models::make_model("mlp", Shape{1, 4, 4}, 10, 1);
  DataParallelOptions o;
  o.grad_reduce_dtype = DType::BF16;
  o.math.split_invariant = true;
  testing::expect_user_error([&] { DataParallel dp(*m, parse_devices("cpu:2"), o); },
                                 {"bf16 gradient reduction cannot keep split-invariant math"});
}

}  // namespace
}  // namespace fanout
