// Cross-entropy and mean-squared-error criteria.
#include "runtime/nn/criterion.h"

#include <algorithm>
#include <cmath>
#include <iomanip>

#include "kernels/convert.h"
#include "kernels/loss.h"
#include "runtime/core/error.h"
#include "runtime/nn/autocast.h"

namespace fanout {

void StepResult::merge(const StepResult& o) {
  loss.merge(o.loss);
  loss_sum = loss.value();
  count += o.count;
  for (int i = 0; i < kMetricSums; ++i) sums[i].merge(o.sums[i]);
}

StepResult StepResult::of_rows(const float* losses, int64_t n) {
  StepResult r;
  r.count = n;
  r.loss.add(losses, n);
  r.loss_sum = r.loss.value();
  return r;
}

MetricSpec accuracy_metric(int correct) {
  MetricSpec m;
  m.key = "acc";
  m.summary = "acc %.4f";
  m.final = "accuracy %.4f";
  m.numerator = correct;
  m.picks_best = true;
  return m;
}

namespace {

// Copies `t` (on ctx's device) into the host tensor `h`, sized to match.
void to_host(Context& ctx, const Tensor& t, Tensor& h) {
  ensure(h, t.shape(), t.dtype(), Device::cpu());
  h.copy_from(t, &ctx.compute());
}

// MSE's side of a model output in any storage (a low-type, perhaps
// channels-last, output under autocast): the loss reads it as a float32
// contiguous copy (exact) and computes its gradient in float32, which is
// then stored like the output (rounded to its type, the gradient autocast
// sends back). A float32 contiguous output is used as it is.
class OutputStorage {
 public:
  const Tensor& read(Context& ctx, const Tensor& out) {
    plain_ = out.dtype() == DType::F32 && !out.channels_last();
    if (plain_) return out;
    ensure(out32_, out.shape(), ctx.device());
    kernels::convert(ctx, out, out32_);
    return out32_;
  }
  // A float32 buffer of the output's shape for its gradient.
  Tensor& grad_f32(Context& ctx, const Tensor& out) {
    ensure(grad32_, out.shape(), ctx.device());
    return grad32_;
  }
  // The gradient to send back for the float32 gradient g: g itself (rounded
  // under autocast) for a plain output, else g stored like the output.
  Tensor send(Context& ctx, const Tensor& out, Tensor g) {
    autocast_round(ctx, g);
    if (plain_) return g;
    ensure(low_, out.shape(), out.dtype(), ctx.device(), out.format());
    kernels::convert(ctx, g.view(out.shape()), low_);
    return low_;
  }

 private:
  bool plain_ = true;
  Tensor out32_, grad32_, low_;
};

// In training, the cross-entropy's gradient goes into grad, stored like the
// output (its type) and rounded to autocast's type: the gradient autocast
// sends back. d is grad as the kernel's (rows, classes).
void xent_grad(Context& ctx, const Tensor& out, float scale, Tensor& grad, Tensor& d, kernels::XentOutputs& o) {
  ensure(grad, out.shape(), out.dtype(), ctx.device());
  d = grad.view(Shape{out.numel() / out.size(-1), out.size(-1)});
  o.dlogits = &d;
  o.scale = scale;
  o.round = ctx.math.autocast;
}

class CrossEntropy final : public Criterion {
 public:
  explicit CrossEntropy(float smoothing) : smoothing_(smoothing) {}
  const std::string& name() const override { return name_; }
  bool dense_targets() const override { return false; }
  void forward(Context& ctx, const Tensor& out, const Tensor& target, bool train, float grad_scale) override {
    FANOUT_USER_CHECK(out.dim() == 2 && target.dtype() == DType::I32 && target.shape() == Shape{out.size(0)})
        << "cross_entropy: the output " << out.shape().str() << " must be (N, classes) and the targets (N) int32 "
        << "class indices, not " << dtype_name(target.dtype()) << " " << target.shape().str();
    const Device d = ctx.device();
    ensure(loss_, Shape{1}, d);
    ensure(correct_, Shape{1}, DType::I32, d);
    ensure(rows_, Shape{out.size(0)}, d);
    kernels::XentOutputs o{&rows_, &correct_};
    Tensor dlogits;
    if (train) xent_grad(ctx, out, grad_scale, grad_, dlogits, o);
    kernels::softmax_xent(ctx, out, target, smoothing_, loss_, o);
    targets_ = target;
  }
  const Tensor& grad() const override { return grad_; }
  StepResult read(Context& ctx) override {
    to_host(ctx, rows_, rows_h_);
    to_host(ctx, correct_, correct_h_);
    const Tensor* labels = &targets_;
    if (!targets_.device().is_cpu()) {
      to_host(ctx, targets_, targets_h_);
      labels = &targets_h_;
    }
    ctx.compute().synchronize();
    StepResult r = StepResult::of_rows(rows_h_.f32(), rows_h_.numel());
    r.sums[kCorrectSum].add(static_cast<float>(correct_h_.data<int32_t>()[0]));
    // The accuracy's denominator: the rows whose label is not ignored (-1), as torch's ignore_index.
    const int32_t* y = labels->data<int32_t>();
    r.sums[kTargetsSum].add_count(
        std::count_if(y, y + labels->numel(), [](int32_t v) { return v != kernels::kIgnoreLabel; }));
    return r;
  }
  int64_t result_bytes(const Shape& out) const override { return out[0] * 8 + 4; }
  std::unique_ptr<Criterion> clone() const override { return std::make_unique<CrossEntropy>(smoothing_); }
  std::vector<MetricSpec> metrics() const override {
    MetricSpec acc = accuracy_metric();
    acc.denominator = kTargetsSum;
    return {acc};
  }
  std::vector<std::string> sum_names() const override { return {"correct", "targets"}; }
  const char* loss_format() const override { return "%.4f"; }

 private:
  const std::string name_ = criterion_name(CriterionKind::CrossEntropy);
  float smoothing_;
  Tensor loss_, correct_, rows_, grad_, targets_, rows_h_, correct_h_, targets_h_;
};

class TokenCrossEntropy final : public Criterion {
 public:
  explicit TokenCrossEntropy(float smoothing) : smoothing_(smoothing) {}
  const std::string& name() const override { return name_; }
  bool dense_targets() const override { return false; }
  void forward(Context& ctx, const Tensor& out, const Tensor& target, bool train, float grad_scale) override {
    FANOUT_USER_CHECK(out.dim() == 3 && target.dtype() == DType::I32 &&
                      target.dim() == 2 && target.size(0) == out.size(0) && target.size(1) == out.size(1))
        << "token_cross_entropy: the output " << out.shape().str() << " must be (B, T, vocab) and the targets "
        << "(B, T) int32 token ids, not " << dtype_name(target.dtype()) << " " << target.shape().str();
    const Device d = ctx.device();
    const int64_t b = out.size(0), t = out.size(1), v = out.size(2);
    const Tensor logits = out.view(Shape{b * t, v}), labels = target.view(Shape{b * t});
    ensure(loss_, Shape{1}, d);
    ensure(correct_, Shape{1}, DType::I32, d);
    ensure(tokens_, Shape{b * t}, d);
    kernels::XentOutputs o{&tokens_, &correct_};
    Tensor dlogits;
    // A row's loss is its tokens' sum / T: each token's gradient is scaled by 1 / T too.
    if (train) xent_grad(ctx, out, grad_scale / static_cast<float>(t), grad_, dlogits, o);
    try {
      kernels::softmax_xent(ctx, logits, labels, smoothing_, loss_, o);
    } catch (const Error&) {
      // The kernel numbers the flattened (B * T) rows: name the batch row and position instead.
      if (target.device().is_cpu())
        for (int64_t i = 0; i < b * t; ++i) {
          const int32_t y = target.data<int32_t>()[i];
          FANOUT_USER_CHECK((y >= 0 && y < v) || y == kernels::kIgnoreLabel)
              << "token_cross_entropy: target " << y << " at batch row " << ctx.first_row + i / t << ", position "
              << i % t << " is outside [0, " << v << ")";
        }
      throw;
    }
    targets_ = target;
    rows_ = b;
  }
  const Tensor& grad() const override { return grad_; }
  StepResult read(Context& ctx) override {
    to_host(ctx, tokens_, tokens_h_);
    to_host(ctx, correct_, correct_h_);
    const Tensor* labels = &targets_;
    if (!targets_.device().is_cpu()) {
      to_host(ctx, targets_, targets_h_);
      labels = &targets_h_;
    }
    ctx.compute().synchronize();
    const int64_t t = tokens_h_.numel() / rows_;
    ensure(row_h_, Shape{rows_}, Device::cpu());
    int64_t counted = 0;
    for (int64_t r = 0; r < rows_; ++r) {
      double sum = 0;
      for (int64_t j = 0; j < t; ++j) {
        sum += tokens_h_.f32()[r * t + j];
        counted += labels->data<int32_t>()[r * t + j] == kernels::kIgnoreLabel ? 0 : 1;
      }
      row_h_.f32()[r] = static_cast<float>(sum / static_cast<double>(t));
    }
    StepResult res = StepResult::of_rows(row_h_.f32(), rows_);
    res.sums[kCorrectSum].add(static_cast<float>(correct_h_.data<int32_t>()[0]));
    res.sums[kTargetsSum].add_count(counted);
    return res;
  }
  int64_t result_bytes(const Shape& out) const override { return out[0] * out[1] * 8 + 4; }
  std::unique_ptr<Criterion> clone() const override { return std::make_unique<TokenCrossEntropy>(smoothing_); }
  std::vector<MetricSpec> metrics() const override {
    MetricSpec acc = accuracy_metric();
    acc.denominator = kTargetsSum;
    acc.picks_best = false;  // a language model's best checkpoint is its lowest loss
    return {acc};
  }
  std::vector<std::string> sum_names() const override { return {"correct", "targets"}; }
  const char* loss_format() const override { return "%.4f"; }

 private:
  const std::string name_ = criterion_name(CriterionKind::TokenCrossEntropy);
  float smoothing_;
  int64_t rows_ = 0;
  Tensor loss_, correct_, tokens_, targets_, grad_, tokens_h_, correct_h_, targets_h_, row_h_;
};

class MeanSquaredError final : public Criterion {
 public:
  const std::string& name() const override { return name_; }
  bool dense_targets() const override { return true; }
  void forward(Context& ctx, const Tensor& out, const Tensor& target, bool train, float grad_scale) override {
    FANOUT_USER_CHECK(target.dtype() == DType::F32 && target.shape() == out.shape())
        << "mse: the targets (" << dtype_name(target.dtype()) << " " << target.shape().str()
        << ") must be float32 of the output's shape " << out.shape().str();
    const Device d = ctx.device();
    const Tensor& o = storage_.read(ctx, out);
    ensure(rows_, Shape{out.size(0)}, d);
    Tensor* g = train ? &storage_.grad_f32(ctx, out) : nullptr;
    kernels::mse_forward(ctx, o, target, grad_scale, rows_, g);
    if (g) grad_ = storage_.send(ctx, out, *g);
    shape_ = out.shape();
    heatmaps_ = out.dim() >= 3;
    if (heatmaps_) {
      const int64_t planes = out.size(0) * out.size(1), s = out.numel() / planes;
      ensure(idx_, Shape{2, planes}, DType::I32, d);
      ensure(val_, Shape{2, planes}, d);
      Tensor oi = idx_.slice(0, 1).view(Shape{planes}), ti = idx_.slice(1, 2).view(Shape{planes});
      Tensor ov = val_.slice(0, 1).view(Shape{planes}), tv = val_.slice(1, 2).view(Shape{planes});
      kernels::plane_argmax(ctx, o.view(Shape{planes, s}), oi, ov);
      kernels::plane_argmax(ctx, target.view(Shape{planes, s}), ti, tv);
    }
  }
  const Tensor& grad() const override { return grad_; }
  StepResult read(Context& ctx) override {
    to_host(ctx, rows_, rows_h_);
    if (heatmaps_) {
      to_host(ctx, idx_, idx_h_);
      to_host(ctx, val_, val_h_);
    }
    ctx.compute().synchronize();
    StepResult r = StepResult::of_rows(rows_h_.f32(), rows_h_.numel());
    if (heatmaps_) score(r);
    return r;
  }
  int64_t result_bytes(const Shape& out) const override {
    return out[0] * 4 + (out.ndim >= 3 ? out[0] * out[1] * 16 : 0);
  }
  std::unique_ptr<Criterion> clone() const override { return std::make_unique<MeanSquaredError>(); }
  // Heatmaps (outputs of 1 to 3 spatial dims) alone count points: other
  // dense outputs report the loss alone.
  std::vector<MetricSpec> metrics() const override {
    MetricSpec error{"loc_error", "loc err %.2f", "localization error %.3f voxels", kDistanceSum, kPointsSum, 1};
    MetricSpec near{"within_2", "(%.1f%% within 2)", "(%.1f%% within 2)", kNearSum, kPointsSum, 100, true};
    return {error, near};
  }
  std::vector<std::string> sum_names() const override { return {"points", "near", "distance"}; }

 private:
  // The heatmap metric from the argmax of each output plane and target plane.
  void score(StepResult& r) const {
    const int64_t planes = shape_[0] * shape_[1];
    const int32_t* oi = idx_h_.data<int32_t>();
    const int32_t* ti = oi + planes;
    const float* tv = val_h_.f32() + planes;
    for (int64_t p = 0; p < planes; ++p) {
      if (!(tv[p] > 0)) continue;  // no peak in the volume: nothing to find
      int64_t a = oi[p], b = ti[p];
      double d2 = 0;
      for (int axis = shape_.ndim - 1; axis >= 2; --axis) {
        const int64_t n = shape_[axis];
        const double diff = static_cast<double>(a % n - b % n);
        d2 += diff * diff;
        a /= n;
        b /= n;
      }
      const float dist = static_cast<float>(std::sqrt(d2));
      r.sums[kPointsSum].add(1.0f);
      if (dist <= kNearVoxels) r.sums[kNearSum].add(1.0f);
      r.sums[kDistanceSum].add(dist);
    }
  }
  const std::string name_ = criterion_name(CriterionKind::Mse);
  Shape shape_;
  bool heatmaps_ = false;
  OutputStorage storage_;
  Tensor rows_, grad_, idx_, val_, rows_h_, idx_h_, val_h_;
};

}  // namespace

const char* criterion_name(CriterionKind k) {
  switch (k) {
    case CriterionKind::Mse: return "mse";
    case CriterionKind::TokenCrossEntropy: return "token_cross_entropy";
    default: return "cross_entropy";
  }
}

std::unique_ptr<Criterion> make_criterion(const LossOptions& o) {
  FANOUT_USER_CHECK(o.criterion == CriterionKind::CrossEntropy || o.criterion == CriterionKind::Mse ||
                    o.criterion == CriterionKind::TokenCrossEntropy)
      << "unknown criterion kind " << static_cast<int>(o.criterion);
  if (o.criterion == CriterionKind::Mse) {
    FANOUT_USER_CHECK(o.label_smoothing == 0) << "label smoothing applies to cross_entropy, not mse";
    return std::make_unique<MeanSquaredError>();
  }
  FANOUT_USER_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1)  // torch's range: 1 is uniform targets
      << "label smoothing must be in [0, 1], got " << std::setprecision(9) << o.label_smoothing;
  if (o.criterion == CriterionKind::TokenCrossEntropy) return std::make_unique<TokenCrossEntropy>(o.label_smoothing);
  return std::make_unique<CrossEntropy>(o.label_smoothing);
}

}  // namespace fanout
