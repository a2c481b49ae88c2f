// Errors inside a DataParallel replica speak of the user's batch: a bad
// label at batch row 7 names row 7 (not the replica's row 3), and a wrong
// input shape names the rows the replica held and the batch's shape.
#include <gtest/gtest.h>

#include "models/zoo/gpt.h"
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

// A token target outside the vocabulary names its batch row and position
// (the loss sees (B * T) flattened rows), on one device and on a replica.
TEST(ReplicaErrors, ABadTokenTargetNamesItsRowAndPosition) {
  const models::GPTConfig c{.block_size = 8, .vocab_size = 20, .n_layer = 1, .n_head = 2, .n_embd = 8};
  LossOptions loss;
  loss.criterion = CriterionKind::TokenCrossEntropy;
  std::mt19937_64 rng(5);
  Tensor x = Tensor::empty(Shape{4, 8}, DType::I32), y = Tensor::empty(Shape{4, 8}, DType::I32);
  for (int64_t i = 0; i < 32; ++i) x.data<int32_t>()[i] = y.data<int32_t>()[i] = static_cast<int32_t>(rng() % 20);
  y.data<int32_t>()[2 * 8 + 5] = 20;
  auto one = models::gpt(c, 3);
  SingleDeviceEngine engine(*one, Device::cpu(), *make_criterion(loss), 1);
  testing::expect_user_error([&] { engine.forward_backward_batch(x, y); },
                             {"token_cross_entropy: target 20 at batch row 2, position 5 is outside [0, 20)"});
  auto two = models::gpt(c, 3);
  DataParallelEngine dp(*two, parse_devices("cpu:2"), *make_criterion(loss));
  testing::expect_user_error([&] { dp.forward_backward_batch(x, y); }, {"target 20 at batch row 2, position 5"});
  // An input id outside the vocabulary, on the second replica: the user's row and its position in it.
  y.data<int32_t>()[2 * 8 + 5] = 1;
  x.data<int32_t>()[3 * 8 + 1] = 21;
  testing::expect_user_error([&] { dp.forward_backward_batch(x, y); },
                             {"embedding_forward: id 21 at batch row 3, position 1 is outside the vocabulary [0, 20)"});
}

// Misuse a library user can reach: one line each, no internal check.
TEST(ReplicaErrors, EmptyBatchesAndDeviceListsAreOneLineErrors) {
  auto m = models::make_model("mlp", Shape{1, 2, 1}, 3, 1);
  SingleDeviceEngine one(*m, Device::cpu(), *make_criterion({}), 1);
  const Tensor x = Tensor::zeros(Shape{0, 1, 2, 1}), y = Tensor::zeros(Shape{0}, DType::I32);
  testing::expect_user_error([&] { one.forward_backward_batch(x, y); }, {"forward needs a non-empty batch, got (0, 1, 2, 1)"});
  testing::expect_user_error([&] { one.eval_step(x, y); }, {"non-empty batch"});
  testing::expect_user_error([&] { one.forward_backward_batch(Tensor(), y); },
                             {"the batch's input is an undefined tensor (Tensor())"});
  auto n = models::make_model("mlp", Shape{1, 2, 1}, 3, 1);
  testing::expect_user_error([&] { DataParallelEngine(*n, {}, *make_criterion({})); },
                             {"DataParallel needs at least one device"});
  DataParallelOptions o;
  o.output_device = Device::cpu(5);
  testing::expect_user_error([&] { DataParallelEngine(*n, parse_devices("cpu:2"), *make_criterion({}), o); },
                             {"output device cpu:5 is not one of the replicas' devices"});
  LossOptions bad;
  bad.criterion = static_cast<CriterionKind>(9);
  testing::expect_user_error([&] { make_criterion(bad); }, {"unknown criterion kind 9"});
  auto k = models::make_model("mlp", Shape{1, 2, 1}, 3, 1);
  DataParallelEngine two(*k, parse_devices("cpu:2"), *make_criterion({}));
  testing::expect_user_error([&] { two.eval_step(Tensor::zeros(Shape{2, 1, 2, 1}), Tensor()); },
                             {"the batch's targets are an undefined tensor (Tensor())"});
}

}  // namespace
}  // namespace fanout
