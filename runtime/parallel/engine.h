// Engine: runs one training or evaluation step of a model over a batch that
// lives in host memory. The single-device engine runs it directly; the
// DataParallel engine scatters it over replicas. The training loop only sees
// this interface.
#pragma once
#include <cstdint>

#include "runtime/core/tensor.h"
#include "runtime/nn/module.h"
#include "runtime/optim/sgd.h"

namespace fanout {

struct StepResult {
  double loss_sum = 0;  // sum over the batch of the per-sample loss
  int64_t correct = 0;  // rows whose argmax equals the label
  int64_t count = 0;    // rows in the batch
};

struct LossOptions {
  float label_smoothing = 0.0f;
};

// With math.split_invariant: checks that it can hold for `model` on `device`
// (CPU devices, no BatchNorm), switches its gradients to float64 and OpenBLAS
// to one thread (its results depend on its thread count), so training gives
// the same parameters however the batch is split. No-op when off.
void apply_split_invariant(Module& model, Device device, const MathOptions& math);

// OpenBLAS threads for `replicas` CPU replicas running at once: every core
// for one replica, one each for several (and always one when split-invariant).
int cpu_blas_threads(int replicas, const MathOptions& math);

class Engine {
 public:
  virtual ~Engine() = default;
  // Forward, loss (mean over the batch), backward and one optimizer step at `lr`.
  // x (B, C, H, W) float32, y (B) int32, both on the CPU.
  virtual StepResult train_step(const Tensor& x, const Tensor& y, float lr) = 0;
  // Forward in eval mode; no gradients.
  virtual StepResult eval_step(const Tensor& x, const Tensor& y) = 0;
  // The model whose parameters are the ones trained (on the primary device).
  virtual Module& model() = 0;
  virtual optim::SGD& optimizer() = 0;
  virtual Context& primary_context() = 0;
};

}  // namespace fanout
