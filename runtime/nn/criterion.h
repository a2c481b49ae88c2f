// Criteria: the loss as a unit of its own. Given a model's output and the
// targets on one device, a criterion computes each row's loss, its metrics
// and (in training) the gradient of the loss with respect to the output.
// Engines run one per replica, where the output lives; what reaches the
// training loop are exact sums (StepResult), so results do not depend on
// how a batch was split over replicas or processes.
//
//   cross_entropy  targets (N) int32 class indices; softmax cross-entropy
//                  with label smoothing (torch.nn.CrossEntropyLoss); metric:
//                  accuracy, the share of rows whose argmax is the label.
//   token_cross_entropy  outputs (B, T, V) (a language model's logits),
//                  targets (B, T) int32 token ids, -1 where the loss ignores
//                  the position (torch's ignore_index, as nanoGPT); a row's
//                  loss is the sum of its tokens' cross-entropy over T, so the
//                  loss is the mean over the tokens when none is ignored (the
//                  gradient's direction is torch's mean over the tokens in any
//                  case); metric: accuracy over the targets not ignored.
//   mse            targets float32 of the output's shape (dense targets;
//                  torch.nn.MSELoss, reduction mean); for (N, C, spatial...)
//                  outputs with 1 to 3 spatial dims, also the heatmap
//                  metrics: per (row, channel) whose target has a positive
//                  peak, the distance in voxels between the output's argmax
//                  and the target's (the landmark's voxel), averaged, and the
//                  share within kNearVoxels.
//
// A criterion's metrics are its own: it counts what it needs in
// StepResult::sums and names, in metrics(), each metric as a ratio of two
// of them. The training loop, its summary line, the metrics file and
// dp-bench read them by name and know nothing of the task.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/exact_sum.h"
#include "runtime/core/tensor.h"

namespace fanout {

// A heatmap peak counts as found within this distance (voxels).
inline constexpr double kNearVoxels = 2.0;

// The sums a criterion may count per step besides its loss (StepResult::sums).
inline constexpr int kMetricSums = 3;

struct StepResult {
  double loss_sum = 0;  // loss.value(): the exact sum over the rows of their loss, rounded to double
  ExactSum loss;        // the rows' losses (each rounded to float), summed exactly
  int64_t count = 0;    // rows
  // The criterion's own sums, summed exactly (counts add 1 each), so they
  // merge over replicas and processes in any order to the same bits; what
  // each one is, the criterion's metrics() says.
  std::array<ExactSum, kMetricSums> sums;
  // Adds o's sums to this one's.
  void merge(const StepResult& o);
  // The result of n rows whose losses are `losses` (host memory): their
  // count and exact sum, no other sums yet.
  static StepResult of_rows(const float* losses, int64_t n);
};

// One metric of a criterion: sums[numerator] / sums[denominator] (or / the
// rows when denominator is kRows) over an epoch. Reported when its
// denominator is nonzero in the epoch's training or test pass.
struct MetricSpec {
  static constexpr int kRows = -1;
  std::string key;      // the metrics file's key after "train_" / "test_": "acc"
  std::string summary;  // printf format of the summary line and progress: "acc %.4f"
  std::string final;    // printf format of a run's final line: "accuracy %.4f"
  int numerator = 0;
  int denominator = kRows;
  double scale = 1;     // the printed value is the ratio times this (100: a percentage)
  // best.safetensors keeps the epoch whose test value of this metric is the
  // highest (without such a metric: the lowest test loss).
  bool picks_best = false;
};

// The built-in criteria's sums: cross_entropy counts the rows whose argmax
// is the label; mse on heatmaps the peaks scored, those found within
// kNearVoxels, and the distances (each rounded to float).
inline constexpr int kCorrectSum = 0;
inline constexpr int kPointsSum = 0, kNearSum = 1, kDistanceSum = 2;
// cross_entropy and token_cross_entropy: sums[kCorrectSum] the rows (tokens) predicted, sums[kTargetsSum]
// those not ignored, the accuracy's denominator.
inline constexpr int kTargetsSum = 1;

// Accuracy from sums[correct] (cross_entropy's metric, for criteria that count it too).
MetricSpec accuracy_metric(int correct = kCorrectSum);

enum class CriterionKind { CrossEntropy, Mse, TokenCrossEntropy };
const char* criterion_name(CriterionKind k);  // "cross_entropy", "mse", "token_cross_entropy"

struct LossOptions {
  CriterionKind criterion = CriterionKind::CrossEntropy;
  float label_smoothing = 0.0f;  // cross_entropy and token_cross_entropy
};

class Criterion {
 public:
  virtual ~Criterion() = default;
  virtual const std::string& name() const = 0;
  // Whether targets are class indices ((N) int32) or dense (the output's shape, float32).
  virtual bool dense_targets() const = 0;
  // out (N, ...) and target on ctx's device. Computes the rows' losses and
  // metrics and, when train, grad() = grad_scale * d(sum of the rows' losses)/d(out).
  virtual void forward(Context& ctx, const Tensor& out, const Tensor& target, bool train, float grad_scale) = 0;
  // The output gradient of the last training forward, on ctx's device.
  virtual const Tensor& grad() const = 0;
  // Waits for ctx's compute stream and returns the last forward's sums.
  virtual StepResult read(Context& ctx) = 0;
  // Bytes read() copies from the device for `rows` rows of output `out_shape`.
  virtual int64_t result_bytes(const Shape& out_shape) const = 0;
  // A criterion with the same options and its own buffers (one per replica).
  virtual std::unique_ptr<Criterion> clone() const = 0;
  // The metrics it reports from its sums (none: the loss alone), the first
  // one also in the progress line; and the names of the sums it uses, which
  // a checkpoint stores them under.
  virtual std::vector<MetricSpec> metrics() const { return {}; }
  virtual std::vector<std::string> sum_names() const { return {}; }
  // printf format of its mean loss in the summary line.
  virtual const char* loss_format() const { return "%.4g"; }
};

// One-line error for an unknown criterion or bad options.
std::unique_ptr<Criterion> make_criterion(const LossOptions& o);

}  // namespace fanout
