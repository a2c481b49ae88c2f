// Engine helpers shared by the single-device, DataParallel and DDP engines.
#include "runtime/parallel/engine.h"

#include <algorithm>
#include <thread>

#include "kernels/gemm.h"
#include "kernels/loss.h"
#include "runtime/core/error.h"
#include "runtime/core/exact_sum.h"

namespace fanout {

void apply_split_invariant(Module& model, Device device, const MathOptions& math) {
  if (!math.split_invariant) return;
  FANOUT_USER_CHECK(device.is_cpu()) << "--split-invariant is implemented for CPU devices only, not "
                                     << device.str();
  for (auto& [name, m] : model.named_modules())
    FANOUT_USER_CHECK(m->type_name() != "BatchNorm2d")
        << "--split-invariant cannot hold for a model with BatchNorm (" << (name.empty() ? "the model" : name)
        << "): its batch statistics depend on the split by definition";
  model.set_grad_dtype(DType::F64);
  kernels::set_cpu_blas_threads(1);
}

int cpu_blas_threads(int replicas, const MathOptions& math, int processes) {
  if (math.split_invariant) return 1;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, replicas * processes));
}

void XentHead::forward(Context& ctx, const Tensor& logits, const Tensor& labels, bool train, float grad_scale) {
  const Device d = ctx.device();
  ensure(probs_, logits.shape(), d);
  ensure(loss_t_, Shape{1}, d);
  ensure(correct_t_, Shape{1}, DType::I32, d);
  ensure(row_loss_t_, Shape{logits.size(0)}, d);
  kernels::softmax_xent_forward(ctx, logits, labels, opts_.label_smoothing, probs_, loss_t_, &row_loss_t_);
  kernels::count_correct(ctx, logits, labels, correct_t_);
  if (train) {
    ensure(dlogits_, logits.shape(), d);
    kernels::softmax_xent_backward(ctx, probs_, labels, opts_.label_smoothing, grad_scale, dlogits_);
  }
}

StepResult XentHead::read(Context& ctx) {
  const int64_t n = row_loss_t_.numel();
  ensure(row_loss_h_, Shape{n}, Device::cpu());
  ensure(correct_h_, Shape{1}, DType::I32, Device::cpu());
  row_loss_h_.copy_from(row_loss_t_, &ctx.compute());
  correct_h_.copy_from(correct_t_, &ctx.compute());
  ctx.compute().synchronize();
  ExactSum s;
  s.add(row_loss_h_.f32(), n);
  return {s.value(), correct_h_.data<int32_t>()[0], n, row_loss_h_};
}

}  // namespace fanout
