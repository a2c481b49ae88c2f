// Criteria: the loss as a unit of its own. Given a model's output and the
// targets on one device, a criterion computes each row's loss, its metrics
// and (in training) the gradient of the loss with respect to the output.
// Engines run one per replica, where the output lives; what reaches the
// training loop are exact sums (StepResult), so results do not depend on
// how a batch was split over replicas or processes.
//
//   cross_entropy  targets (N) int32 class indices; softmax cross-entropy
//                  with label smoothing (torch.nn.CrossEntropyLoss); metric:
//                  rows whose argmax is the label.
//   mse            targets float32 of the output's shape (dense targets;
//                  torch.nn.MSELoss, reduction mean); for (N, C, spatial...)
//                  outputs with 1 to 3 spatial dims, also the heatmap metric:
//                  per (row, channel) whose target has a positive peak, the
//                  distance in voxels between the output's argmax and the
//                  target's (the landmark's voxel), and whether it is within
//                  kNearVoxels.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/core/context.h"
#include "runtime/core/exact_sum.h"
#include "runtime/core/tensor.h"

namespace fanout {

// A heatmap peak counts as found within this distance (voxels).
inline constexpr double kNearVoxels = 2.0;

struct StepResult {
  double loss_sum = 0;  // loss.value(): the exact sum over the rows of their loss, rounded to double
  ExactSum loss;        // the rows' losses (each rounded to float), summed exactly
  int64_t count = 0;    // rows
  int64_t correct = 0;  // cross_entropy: rows whose argmax is the label
  // mse on heatmaps: peaks scored, those found within kNearVoxels, and the
  // distances' exact sum (each rounded to float).
  int64_t points = 0, near = 0;
  ExactSum distance;
  // Adds o's sums to this one's.
  void merge(const StepResult& o);
};

enum class CriterionKind { CrossEntropy, Mse };
const char* criterion_name(CriterionKind k);  // "cross_entropy", "mse"

struct LossOptions {
  CriterionKind criterion = CriterionKind::CrossEntropy;
  float label_smoothing = 0.0f;  // cross_entropy only
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
};

// One-line error for an unknown criterion or bad options.
std::unique_ptr<Criterion> make_criterion(const LossOptions& o);

}  // namespace fanout
