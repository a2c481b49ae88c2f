// BatchNorm2d / BatchNorm3d layers, composed from the split statistics kernels.
#include "models/layers/batchnorm.h"

#include "kernels/batchnorm.h"
#include "kernels/elementwise.h"
#include "runtime/core/error.h"

namespace fanout::models {

BatchNormNd::BatchNormNd(int64_t channels, float eps, float momentum) : c_(channels), eps_(eps), momentum_(momentum) {
  FANOUT_CHECK(channels > 0) << "BatchNorm(" << channels << ")";
  w_ = &register_parameter("weight", Shape{channels});
  b_ = &register_parameter("bias", Shape{channels});
  rm_ = &register_buffer("running_mean", Shape{channels});
  rv_ = &register_buffer("running_var", Shape{channels});
  nbt_ = &register_buffer("num_batches_tracked", Shape{}, DType::I64);
}

void BatchNormNd::reset_parameters(std::mt19937_64&) {
  FANOUT_CHECK(w_->value.device().is_cpu()) << "initialization runs on the CPU";
  w_->value.fill(1.0f);
  b_->value.fill(0.0f);
  rm_->value.fill(0.0f);
  rv_->value.fill(1.0f);
  nbt_->value.data<int64_t>()[0] = 0;
}

int64_t BatchNormNd::num_batches_tracked() const { return nbt_->value.data<int64_t>()[0]; }

Tensor BatchNormNd::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(accepts_rank(x.dim()) && x.size(1) == c_)
      << type_name() << "(" << c_ << ") cannot take input of shape " << x.shape().str();
  x_ = x;
  const Device d = ctx.device();
  ensure_like(y_, x, ctx);  // the input's storage
  trained_forward_ = is_training();
  if (!trained_forward_) {
    kernels::bn_forward_eval(ctx, x, rm_->value, rv_->value, w_->value, b_->value, eps_, y_);  // low under autocast
    return y_;
  }
  ensure(mean_, Shape{2, c_}, ctx);
  ensure(invstd_, Shape{c_}, ctx);
  if (ctx.recomputing) {
    // Activation checkpointing: the first forward's (all-reduced) sums; the
    // running statistics were updated then.
    kernels::bn_finalize(ctx, stats_, count_, eps_, momentum_, mean_, invstd_, nullptr, nullptr);
  } else {
    ensure(stats_, Shape{3, c_}, DType::F64, d);  // kept for a recomputation, not a checkpoint slot
    kernels::bn_stats(ctx, x, stats_);
    count_ = x.numel() / c_;
    if (sync_) sync_->all_reduce(layer_id_, stats_, count_, ctx);
    FANOUT_USER_CHECK(count_ > 1) << type_name() << " needs more than one value per channel in training (input "
                                  << x.shape().str() << ")";
    kernels::bn_finalize(ctx, stats_, count_, eps_, momentum_, mean_, invstd_, &rm_->value, &rv_->value);
    ctx.host_effect([nbt = nbt_] { nbt->value.data<int64_t>()[0] += 1; });
  }
  kernels::bn_apply(ctx, x, mean_, invstd_, w_->value, b_->value, y_);  // autocast: float32 statistics, low output
  return y_;
}

Tensor BatchNormNd::backward(const Tensor& dy, Context& ctx) {
  FANOUT_CHECK(trained_forward_) << type_name() << " backward after an eval-mode forward";
  ensure(grad_stats_, Shape{2, c_}, ctx);
  kernels::bn_backward_reduce(ctx, x_, dy, mean_, invstd_, grad_stats_);
  // dgamma += sum(dy * xhat), dbeta += sum(dy): the local sums, before any sync.
  kernels::axpy(ctx, 1.0f, grad_stats_.flat(0, Shape{c_}), b_->grad);
  kernels::axpy(ctx, 1.0f, grad_stats_.flat(c_, Shape{c_}), w_->grad);
  notify_grads_ready(ctx);
  int64_t count = count_;
  if (sync_) {
    int64_t local = x_.numel() / c_;
    sync_->all_reduce(layer_id_, grad_stats_, local, ctx);
    count = local;
  }
  ensure_like(dx_, x_, ctx);
  kernels::bn_backward_apply(ctx, x_, dy, mean_, invstd_, w_->value, grad_stats_, count, dx_);  // low under autocast
  return dx_;
}

}  // namespace fanout::models
