// Errors inside a DataParallel replica speak of the user's batch: a bad
// label at batch row 7 names row 7 (not the replica's row 3), and a wrong
// input shape names the rows the replica held and the batch's shape.
#include <gtest/gtest.h>

#include "models/zoo/zoo.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/single_device.h"
#include "support/test_util.h"

namespace fanout {
namespace {

TEST(ReplicaErrors, ABadLabelNamesItsBatchRow) {
  for (bool gather : {false, true}) {
    SCOPED_TRACE(gather ? "outputs gathered" : "loss on the replicas");
    auto m = models::make_model("mlp", Shape{1, 2, 1}, 3, 1);
    DataParallelOptions o;
    o.loss_on_replicas = !gather;
    DataParallelEngine dp(*m, parse_devices("cpu:2"), *make_criterion({}), o);
    std::mt19937_64 rng(3);
    Tensor x = testing::random_tensor(Shape{8, 1, 2, 1}, rng);
    Tensor y = testing::random_labels(8, 3, rng);
    y.data<int32_t>()[7] = 5;
    const std::string msg =
        testing::expect_user_error([&] { dp.forward_backward_batch(x, y); }, {"label 5 at batch row 7", "[0, 3)"});
    if (!gather) EXPECT_NE(msg.find("replica 1 of 2: batch rows 4..7 of the batch (8, 1, 2, 1)"), std::string::npos) << msg;
  }
  // One device: the same row.
  auto m = models::make_model("mlp", Shape{1, 2, 1}, 3, 1);
  SingleDeviceEngine one(*m, Device::cpu(), *make_criterion({}), 1);
  std::mt19937_64 rng(3);
  Tensor x = testing::random_tensor(Shape{8, 1, 2, 1}, rng);
  Tensor y = testing::random_labels(8, 3, rng);
  y.data<int32_t>()[7] = 5;
  testing::expect_user_error([&] { one.forward_backward_batch(x, y); }, {"label 5 at batch row 7"});
}

TEST(ReplicaErrors, AWrongInputShapeNamesTheBatch) {
  auto m = models::make_model("lenet", Shape{1, 28, 28}, 10, 1);
  DataParallelEngine dp(*m, parse_devices("cpu:2"), *make_criterion({}));
  std::mt19937_64 rng(4);
  Tensor x = testing::random_tensor(Shape{8, 3, 28, 28}, rng);  // 3 channels where lenet takes 1
  Tensor y = testing::random_labels(8, 10, rng);
  testing::expect_user_error([&] { dp.forward_backward_batch(x, y); },
                             {"cannot take input of shape", "of the batch (8, 3, 28, 28)"});
}

}  // namespace
}  // namespace fanout
