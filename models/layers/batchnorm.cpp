// BatchNorm2d / BatchNorm3d layers, composed from the split statistics kernels.
#include "models/layers/batchnorm.h"

#include "kernels/batchnorm.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "runtime/nn/autocast.h"
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

bool BatchNormNd::begin_forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(accepts_rank(x.dim()) && x.size(1) == c_)
      << type_name() << "(" << c_ << ") cannot take input of shape " << x.shape().str();
  x_ = x;
  ensure_like(y_, x, ctx);  // the input's storage
  trained_forward_ = is_training();
  grad_reduced_ = dx_ready_ = mask_written_ = false;
  if (trained_forward_) {
    ensure(mean_, Shape{2, c_}, ctx);
    ensure(invstd_, Shape{c_}, ctx);
  }
  return trained_forward_;
}

void BatchNormNd::batch_statistics(const Tensor& x, Context& ctx) {
  if (ctx.recomputing) {
    // Activation checkpointing: the first forward's (all-reduced) sums; the
    // running statistics were updated then.
    kernels::bn_finalize(ctx, stats_, count_, eps_, momentum_, mean_, invstd_, nullptr, nullptr);
    return;
  }
  ensure(stats_, Shape{3, c_}, DType::F64, ctx.device());  // kept for a recomputation, not a checkpoint slot
  kernels::bn_stats(ctx, x, stats_);
  count_ = x.numel() / c_;
  if (sync_) sync_->all_reduce(layer_id_, stats_, count_, ctx);
  check_count(x);
  kernels::bn_finalize(ctx, stats_, count_, eps_, momentum_, mean_, invstd_, &rm_->value, &rv_->value);
  ctx.host_effect([nbt = nbt_] { nbt->value.data<int64_t>()[0] += 1; });
}

void BatchNormNd::check_count(const Tensor& x) const {
  FANOUT_USER_CHECK(count_ > 1) << type_name() << " needs more than one value per channel in training (input "
                                << x.shape().str() << ")";
}

Tensor BatchNormNd::forward(const Tensor& x, Context& ctx) {
  relu_ = false;
  if (!begin_forward(x, ctx)) {
    kernels::bn_forward_eval(ctx, x, rm_->value, rv_->value, w_->value, b_->value, eps_, y_);  // in x's type
    return y_;
  }
  batch_statistics(x, ctx);
  kernels::bn_apply(ctx, x, mean_, invstd_, w_->value, b_->value, y_);  // float32 statistics, y in x's type
  return y_;
}

Tensor BatchNormNd::forward_add_relu(const Tensor& x, const Tensor* z, Context& ctx) {
  relu_ = true;
  if (!begin_forward(x, ctx)) {
    kernels::bn_forward_eval(ctx, x, rm_->value, rv_->value, w_->value, b_->value, eps_, y_);
    if (z) kernels::add(ctx, y_, *z, y_, y_.dtype());
    kernels::relu_forward(ctx, y_, y_);
    return y_;
  }
  if (fuses_whole_pass(ctx)) {
    // One call (one cuDNN graph on a GPU where it has one).
    count_ = x.numel() / c_;
    check_count(x);
    ensure(stats_, Shape{3, c_}, DType::F64, ctx.device());
    Tensor* mask = nullptr;  // where the device's fused pass may keep the ReLU's bit mask
    if (const int64_t bytes = kernels::bn_relu_mask_bytes(ctx, x)) {
      ensure(relu_mask_, Shape{bytes}, DType::U8, ctx);
      mask = &relu_mask_;
    }
    mask_written_ = kernels::bn_train_add_relu(ctx, x, z, w_->value, b_->value, eps_, momentum_, stats_, mean_,
                                               invstd_, rm_->value, rv_->value, y_, mask, y_.dtype());
    ctx.host_effect([nbt = nbt_] { nbt->value.data<int64_t>()[0] += 1; });
    return y_;
  }
  batch_statistics(x, ctx);
  kernels::bn_apply_add_relu(ctx, x, mean_, invstd_, w_->value, b_->value, z, y_, y_.dtype());
  return y_;
}

bool BatchNormNd::fuses_whole_pass(const Context& ctx) const {
  // SyncBatchNorm all-reduces between the steps; a checkpointed block's
  // recomputation needs the float64 sums the split path keeps.
  return !sync_ && !ctx.slots && !ctx.recomputing;
}

Tensor BatchNormNd::relu_grad(const Tensor& dy, Context& ctx) {
  FANOUT_CHECK(relu_) << type_name() << " relu_grad after a forward that was not a forward_add_relu";
  Tensor g = in_storage_of(ctx, dy, y_, dy_moved_);  // masked in place, as an in-place ReLU's backward
  if (!trained_forward_) {  // the ReLU's mask alone: eval_backward takes the rest
    kernels::relu_backward(ctx, y_, g, g);
    grad_reduced_ = true;
    return g;
  }
  ensure(grad_stats_, Shape{2, c_}, ctx);
  if (fuses_whole_pass(ctx)) {
    ensure_like(dx_, x_, ctx);
    kernels::bn_backward_relu(ctx, x_, y_, g, mean_, invstd_, w_->value, mask_written_ ? &relu_mask_ : nullptr,
                              grad_stats_, g, dx_);
    dx_ready_ = true;
  } else {
    kernels::bn_backward_reduce_relu(ctx, x_, y_, g, mean_, invstd_, grad_stats_, g);
  }
  grad_reduced_ = true;
  return g;
}

Tensor BatchNormNd::backward(const Tensor& dy_in, Context& ctx) {
  if (!trained_forward_) return eval_backward(dy_in, ctx);
  Tensor dy = dy_in;
  if (!relu_) {
    ensure(grad_stats_, Shape{2, c_}, ctx);
    kernels::bn_backward_reduce(ctx, x_, dy, mean_, invstd_, grad_stats_);
  } else if (!grad_reduced_) {
    dy = relu_grad(dy_in, ctx);  // ensures grad_stats_ once: inside checkpoint slots each ensure takes a slot
  }
  grad_reduced_ = false;
  // dgamma += sum(dy * xhat), dbeta += sum(dy): the local sums, before any sync.
  kernels::axpy(ctx, 1.0f, grad_stats_.flat(0, Shape{c_}), b_->grad);
  kernels::axpy(ctx, 1.0f, grad_stats_.flat(c_, Shape{c_}), w_->grad);
  notify_grads_ready(ctx);
  if (dx_ready_) {  // bn_backward_relu wrote it
    dx_ready_ = false;
    return dx_;
  }
  int64_t count = count_;
  if (sync_) {
    int64_t local = x_.numel() / c_;
    sync_->all_reduce(layer_id_, grad_stats_, local, ctx);
    count = local;
  }
  ensure_like(dx_, x_, ctx);
  kernels::bn_backward_apply(ctx, x_, dy, mean_, invstd_, w_->value, grad_stats_, count, dx_);  // in x's type
  return dx_;
}

Tensor BatchNormNd::eval_backward(const Tensor& dy, Context& ctx) {
  // A forward_add_relu's gradient comes masked from relu_grad (BasicBlock), or is masked here.
  Tensor g = relu_ && !grad_reduced_ ? relu_grad(dy, ctx) : dy;
  grad_reduced_ = false;
  const Device d = ctx.device();
  if (!eval_zeros_.defined() || eval_zeros_.device() != d) {
    eval_zeros_ = Tensor::zeros(Shape{c_}, DType::F32, d);
    eval_ones_ = Tensor::empty(Shape{c_}, DType::F32, d);
    eval_ones_.fill(1.0f, &ctx.compute());
  }
  // The kernels' own affine pass gives invstd = 1 / sqrt(rv + eps) (of ones, gain 1) and dx = dy * k (of dy,
  // mean 0, shift 0), computed as the eval forward computes k; the mean is rm as the (hi, lo) pair with lo 0.
  ensure(eval_mean_, Shape{2, c_}, DType::F32, d);
  ensure(eval_invstd_, Shape{c_}, DType::F32, d);
  ensure(eval_grad_stats_, Shape{2, c_}, DType::F32, d);
  eval_mean_.flat(0, Shape{c_}).copy_from(rm_->value, &ctx.compute());
  eval_mean_.flat(c_, Shape{c_}).zero(&ctx.compute());
  Tensor inv = eval_invstd_.as(Shape{1, c_}, DType::F32);
  kernels::bn_forward_eval(ctx, eval_ones_.as(Shape{1, c_}, DType::F32), eval_zeros_, rv_->value, eval_ones_,
                           eval_zeros_, eps_, inv);
  kernels::bn_backward_reduce(ctx, x_, g, eval_mean_, eval_invstd_, eval_grad_stats_);
  kernels::axpy(ctx, 1.0f, eval_grad_stats_.flat(0, Shape{c_}), b_->grad);
  kernels::axpy(ctx, 1.0f, eval_grad_stats_.flat(c_, Shape{c_}), w_->grad);
  notify_grads_ready(ctx);
  ensure_like(dx_, x_, ctx);
  kernels::bn_forward_eval(ctx, g, eval_zeros_, rv_->value, w_->value, eval_zeros_, eps_, dx_);  // in x's type
  return dx_;
}

}  // namespace fanout::models
