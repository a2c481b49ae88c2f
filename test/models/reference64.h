// A float64 reference of training steps under autocast, for the tests:
// layers written from torch's definitions that read the operands a step
// stored (low-type values as they are), compute in float64 and round where
// runtime/nn/autocast.h says; and how a step's tensors compare with them.
// test/models/zoo_reference_test.cpp and gpt_reference_test.cpp use it.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/core/tensor.h"
#include "support/test_util.h"

namespace fanout::ref64 {

// A value of the reference: logical shape (N, C, D, H, W) (D = 1 for
// images; C = features and D = H = W = 1 once flattened), and whether its
// storage is the low type (what is stored there is rounded to it).
struct V {
  int64_t n = 0, c = 0, d = 1, h = 1, w = 1;
  std::vector<double> v;
  bool low = false;
  int64_t spatial() const { return d * h * w; }
  double& at(int64_t i, int64_t ch, int64_t z, int64_t y, int64_t x) { return v[(((i * c + ch) * d + z) * h + y) * w + x]; }
  double at(int64_t i, int64_t ch, int64_t z, int64_t y, int64_t x) const {
    return v[(((i * c + ch) * d + z) * h + y) * w + x];
  }
  V like(int64_t cc, int64_t dd, int64_t hh, int64_t ww, bool lo) const {
    V o;
    o.n = n, o.c = cc, o.d = dd, o.h = hh, o.w = ww, o.low = lo;
    o.v.assign(static_cast<size_t>(n * cc * dd * hh * ww), 0.0);
    return o;
  }
};

using Params = std::map<std::string, std::vector<double>>;

struct Reference {
  DType t;
  Params p;      // the parameters' float32 values
  Params grads;  // what backward computes, by parameter name
  std::set<std::string> low_grads;  // those computed in the low type

  double r(double x) const {
    const float f = static_cast<float>(x);
    return t == DType::BF16 ? half::float_from_bf16(half::bf16_from_float(f)) : half::float_from_f16(half::f16_from_float(f));
  }
  void store(V& x) const {
    if (x.low)
      for (double& e : x.v) e = r(e);
  }
  std::vector<double> low_copy(const std::string& name) const {
    std::vector<double> v = p.at(name);
    for (double& e : v) e = r(e);
    return v;
  }
  // A parameter's gradient; a second use of the parameter (a tied weight)
  // adds to it, and the sum is no longer a value of the low type.
  void add_grad(const std::string& name, std::vector<double> g, bool low = false) {
    auto it = grads.find(name);
    if (it != grads.end()) {
      for (size_t i = 0; i < g.size(); ++i) it->second[i] += g[i];
      low_grads.erase(name);
      return;
    }
    grads[name] = std::move(g);
    if (low) low_grads.insert(name);
  }
};

// One layer: forward keeps what backward needs.
class Op {
 public:
  virtual ~Op() = default;
  virtual V forward(Reference& R, const V& x) = 0;
  virtual V backward(Reference& R, const V& dy) = 0;
  virtual std::string type() const = 0;  // the zoo layer's type_name()
};
using Ops = std::vector<std::unique_ptr<Op>>;

inline V run_forward(Ops& ops, Reference& R, V x) {
  for (auto& op : ops) x = op->forward(R, x);
  return x;
}
inline V run_backward(Ops& ops, Reference& R, V dy) {
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) dy = (*it)->backward(R, dy);
  return dy;
}

// A weight layer's output gradient as it takes it: in the low type (its
// output is a low-type tensor; a float32 gradient, as a residual stream's,
// is cast to it, as autocast's cast back does).
inline V taken_low(const Reference& R, V dy) {
  for (double& e : dy.v) e = R.r(e);
  dy.low = true;
  return dy;
}

// Conv2d / Conv3d (cubic kernel k, stride, padding; images: depth 1) and,
// with k = 1 on flattened values, nothing else: Linear is its own op.
class Conv : public Op {
 public:
  std::string type() const override { return spatial_ == 3 ? "Conv3d" : "Conv2d"; }
  Conv(std::string name, int spatial, int64_t k, int64_t stride, int64_t pad, bool bias)
      : name_(std::move(name)), spatial_(spatial), kd_(spatial == 3 ? k : 1), k_(k), s_(stride), pd_(spatial == 3 ? pad : 0), p_(pad),
        sd_(spatial == 3 ? stride : 1), bias_(bias) {}
  V forward(Reference& R, const V& in) override {
    x_ = in;
    for (double& e : x_.v) e = R.r(e);  // the input cast to the low type
    w_ = R.low_copy(name_ + ".weight");
    o_ = static_cast<int64_t>(w_.size()) / (in.c * kd_ * k_ * k_);
    const int64_t od = (in.d + 2 * pd_ - kd_) / sd_ + 1, oh = (in.h + 2 * p_ - k_) / s_ + 1,
                  ow = (in.w + 2 * p_ - k_) / s_ + 1;
    V y = in.like(o_, od, oh, ow, true);
    const std::vector<double> b = bias_ ? R.low_copy(name_ + ".bias") : std::vector<double>(o_, 0.0);
    for (int64_t i = 0; i < y.n; ++i)
      for (int64_t o = 0; o < o_; ++o)
        for (int64_t z = 0; z < od; ++z)
          for (int64_t yy = 0; yy < oh; ++yy)
            for (int64_t xx = 0; xx < ow; ++xx) {
              double s = 0;
              taps(z, yy, xx, [&](int64_t c, int64_t widx, int64_t iz, int64_t iy, int64_t ix) {
                s += x_.at(i, c, iz, iy, ix) * w_[o * x_.c * kd_ * k_ * k_ + widx];
              });
              y.at(i, o, z, yy, xx) = s + b[o];
            }
    R.store(y);
    return y;
  }
  V backward(Reference& R, const V& dy_in) override {
    const V dy = taken_low(R, dy_in);
    V dx = x_.like(x_.c, x_.d, x_.h, x_.w, x_.low);
    std::vector<double> dw(w_.size(), 0.0), db(o_, 0.0);
    for (int64_t i = 0; i < dy.n; ++i)
      for (int64_t o = 0; o < o_; ++o)
        for (int64_t z = 0; z < dy.d; ++z)
          for (int64_t yy = 0; yy < dy.h; ++yy)
            for (int64_t xx = 0; xx < dy.w; ++xx) {
              const double g = dy.at(i, o, z, yy, xx);
              db[o] += g;
              taps(z, yy, xx, [&](int64_t c, int64_t widx, int64_t iz, int64_t iy, int64_t ix) {
                const int64_t wi = o * x_.c * kd_ * k_ * k_ + widx;
                dx.at(i, c, iz, iy, ix) += g * w_[wi];
                dw[wi] += g * x_.at(i, c, iz, iy, ix);
              });
            }
    for (double& e : dw) e = R.r(e);  // dW computed in the low type
    R.add_grad(name_ + ".weight", dw, true);
    if (bias_) {
      for (double& e : db) e = R.r(e);
      R.add_grad(name_ + ".bias", db, true);
    }
    for (double& e : dx.v) e = R.r(e);  // dx computed in the low type, then stored in the input's storage
    R.store(dx);
    return dx;
  }

 private:
  // fn(c, weight index within the output channel's filter, iz, iy, ix) over
  // the input taps inside the volume of output position (z, y, x).
  template <class F>
  void taps(int64_t z, int64_t y, int64_t x, F&& fn) const {
    for (int64_t c = 0; c < x_.c; ++c)
      for (int64_t a = 0; a < kd_; ++a)
        for (int64_t b = 0; b < k_; ++b)
          for (int64_t e = 0; e < k_; ++e) {
            const int64_t iz = z * sd_ - pd_ + a, iy = y * s_ - p_ + b, ix = x * s_ - p_ + e;
            if (iz < 0 || iz >= x_.d || iy < 0 || iy >= x_.h || ix < 0 || ix >= x_.w) continue;
            fn(c, ((c * kd_ + a) * k_ + b) * k_ + e, iz, iy, ix);
          }
  }
  std::string name_;
  int spatial_;
  int64_t kd_, k_, s_, pd_, p_, sd_;
  bool bias_;
  int64_t o_ = 0;
  V x_;
  std::vector<double> w_;
};

class Linear : public Op {
 public:
  std::string type() const override { return "Linear"; }
  // weight: the weight's name when it is not name.weight (GPT's head: wte's).
  explicit Linear(std::string name, bool bias = true, std::string weight = "")
      : name_(std::move(name)), weight_(weight.empty() ? name_ + ".weight" : std::move(weight)), bias_(bias) {}
  V forward(Reference& R, const V& in) override {
    x_ = in;
    for (double& e : x_.v) e = R.r(e);
    w_ = R.low_copy(weight_);
    const int64_t f = in.c;
    o_ = static_cast<int64_t>(w_.size()) / f;
    const std::vector<double> b = bias_ ? R.low_copy(name_ + ".bias") : std::vector<double>(o_, 0.0);
    V y = in.like(o_, 1, 1, 1, true);
    for (int64_t i = 0; i < in.n; ++i)
      for (int64_t o = 0; o < o_; ++o) {
        double s = b[o];
        for (int64_t k = 0; k < f; ++k) s += x_.v[i * f + k] * w_[o * f + k];
        y.v[i * o_ + o] = s;
      }
    R.store(y);
    return y;
  }
  V backward(Reference& R, const V& dy_in) override {
    const V dy = taken_low(R, dy_in);
    const int64_t f = x_.c;
    V dx = x_.like(f, 1, 1, 1, x_.low);
    std::vector<double> dw(w_.size(), 0.0), db(o_, 0.0);
    for (int64_t i = 0; i < dy.n; ++i)
      for (int64_t o = 0; o < o_; ++o) {
        const double g = dy.v[i * o_ + o];
        db[o] += g;
        for (int64_t k = 0; k < f; ++k) {
          dx.v[i * f + k] += g * w_[o * f + k];
          dw[o * f + k] += g * x_.v[i * f + k];
        }
      }
    for (double& e : dw) e = R.r(e);
    for (double& e : db) e = R.r(e);
    R.add_grad(weight_, dw, true);
    if (bias_) R.add_grad(name_ + ".bias", db, true);
    for (double& e : dx.v) e = R.r(e);
    R.store(dx);
    return dx;
  }

 private:
  std::string name_, weight_;
  bool bias_;
  int64_t o_ = 0;
  V x_;
  std::vector<double> w_;
};

// BatchNorm (training: the batch's biased variance, eps 1e-5) and GroupNorm
// (groups of C / G channels per sample): one normalization over index sets.
// BatchNorm stores its output in the input's storage, GroupNorm in float32.
class Norm : public Op {
 public:
  std::string type() const override { return groups_ > 0 ? "GroupNorm" : spatial_ == 3 ? "BatchNorm3d" : "BatchNorm2d"; }
  Norm(std::string name, int spatial, int groups) : name_(std::move(name)), spatial_(spatial), groups_(groups) {}
  V forward(Reference& R, const V& in) override {
    x_ = in;
    gamma_ = R.p.at(name_ + ".weight");
    const std::vector<double>& beta = R.p.at(name_ + ".bias");
    V y = in.like(in.c, in.d, in.h, in.w, groups_ == 0 ? in.low : false);
    xhat_.assign(in.v.size(), 0.0);
    inv_std_.clear();
    for_each_set([&](const std::vector<int64_t>& idx) {
      double m = 0, var = 0;
      for (int64_t i : idx) m += in.v[i];
      m /= static_cast<double>(idx.size());
      for (int64_t i : idx) var += (in.v[i] - m) * (in.v[i] - m);
      var /= static_cast<double>(idx.size());
      const double is = 1.0 / std::sqrt(var + 1e-5);
      inv_std_.push_back(is);
      for (int64_t i : idx) xhat_[i] = (in.v[i] - m) * is;
    });
    for (size_t i = 0; i < in.v.size(); ++i) {
      const int64_t c = channel(static_cast<int64_t>(i));
      y.v[i] = gamma_[c] * xhat_[i] + beta[c];
    }
    R.store(y);
    return y;
  }
  V backward(Reference& R, const V& dy) override {
    V dx = x_.like(x_.c, x_.d, x_.h, x_.w, x_.low);
    std::vector<double> dg(gamma_.size(), 0.0), dbeta(gamma_.size(), 0.0);
    for (size_t i = 0; i < dy.v.size(); ++i) {
      const int64_t c = channel(static_cast<int64_t>(i));
      dg[c] += dy.v[i] * xhat_[i];
      dbeta[c] += dy.v[i];
    }
    size_t set = 0;
    for_each_set([&](const std::vector<int64_t>& idx) {
      const double m = static_cast<double>(idx.size()), is = inv_std_[set++];
      double sum = 0, dot = 0;
      for (int64_t i : idx) {
        const double g = dy.v[i] * gamma_[channel(i)];
        sum += g;
        dot += g * xhat_[i];
      }
      for (int64_t i : idx) dx.v[i] = is / m * (m * dy.v[i] * gamma_[channel(i)] - sum - xhat_[i] * dot);
    });
    R.add_grad(name_ + ".weight", dg);  // float32 gradients: not rounded
    R.add_grad(name_ + ".bias", dbeta);
    R.store(dx);
    return dx;
  }

 private:
  int64_t channel(int64_t i) const { return i / x_.spatial() % x_.c; }
  template <class F>
  void for_each_set(F&& fn) const {
    const int64_t s = x_.spatial();
    if (groups_ == 0) {  // BatchNorm: a channel over the batch
      for (int64_t c = 0; c < x_.c; ++c) {
        std::vector<int64_t> idx;
        for (int64_t i = 0; i < x_.n; ++i)
          for (int64_t k = 0; k < s; ++k) idx.push_back((i * x_.c + c) * s + k);
        fn(idx);
      }
      return;
    }
    const int64_t per = x_.c / groups_;
    for (int64_t i = 0; i < x_.n; ++i)
      for (int64_t g = 0; g < groups_; ++g) {
        std::vector<int64_t> idx;
        for (int64_t c = g * per; c < (g + 1) * per; ++c)
          for (int64_t k = 0; k < s; ++k) idx.push_back((i * x_.c + c) * s + k);
        fn(idx);
      }
  }
  std::string name_;
  int spatial_;
  int groups_;  // 0: BatchNorm
  V x_;
  std::vector<double> gamma_, xhat_, inv_std_;
};

class Relu : public Op {
 public:
  std::string type() const override { return "ReLU"; }
  V forward(Reference&, const V& in) override {
    y_ = in;
    for (double& e : y_.v) e = std::max(e, 0.0);
    return y_;
  }
  V backward(Reference& R, const V& dy) override {
    V dx = dy;
    dx.low = y_.low;
    for (size_t i = 0; i < dx.v.size(); ++i) dx.v[i] = y_.v[i] > 0 ? dy.v[i] : 0.0;
    R.store(dx);  // in the activation's storage
    return dx;
  }

 private:
  V y_;
};

// MaxPool (window k, stride k, no padding; depth too for volumes): the first
// maximum of each window in its row-major order takes the gradient.
class MaxPool : public Op {
 public:
  std::string type() const override { return kd_ == 1 ? "MaxPool2d" : "MaxPool3d"; }
  MaxPool(int spatial, int64_t k) : kd_(spatial == 3 ? k : 1), k_(k) {}
  V forward(Reference&, const V& in) override {
    x_ = in;
    V y = in.like(in.c, in.d / kd_, in.h / k_, in.w / k_, in.low);
    arg_.assign(y.v.size(), 0);
    for (int64_t i = 0; i < y.n; ++i)
      for (int64_t c = 0; c < y.c; ++c)
        for (int64_t z = 0; z < y.d; ++z)
          for (int64_t yy = 0; yy < y.h; ++yy)
            for (int64_t xx = 0; xx < y.w; ++xx) {
              double best = -std::numeric_limits<double>::infinity();
              int64_t at = 0;
              for (int64_t a = 0; a < kd_; ++a)
                for (int64_t b = 0; b < k_; ++b)
                  for (int64_t e = 0; e < k_; ++e) {
                    const int64_t j = (((i * in.c + c) * in.d + z * kd_ + a) * in.h + yy * k_ + b) * in.w + xx * k_ + e;
                    if (in.v[j] > best) best = in.v[j], at = j;
                  }
              const int64_t o = (((i * y.c + c) * y.d + z) * y.h + yy) * y.w + xx;
              y.v[o] = best;
              arg_[o] = at;
            }
    return y;
  }
  V backward(Reference&, const V& dy) override {
    V dx = x_.like(x_.c, x_.d, x_.h, x_.w, x_.low);
    for (size_t o = 0; o < dy.v.size(); ++o) dx.v[arg_[o]] += dy.v[o];
    return dx;
  }

 private:
  int64_t kd_, k_;
  V x_;
  std::vector<int64_t> arg_;
};

// Upsample (nearest, integer scale s over D, H, W): dx sums each s^3 block.
class Upsample : public Op {
 public:
  std::string type() const override { return "Upsample3d"; }
  explicit Upsample(int64_t s) : s_(s) {}
  V forward(Reference& R, const V& in) override {
    x_ = in;
    V y = in.like(in.c, in.d * s_, in.h * s_, in.w * s_, in.low);
    each(y, [&](int64_t i, int64_t c, int64_t z, int64_t yy, int64_t xx) {
      y.at(i, c, z, yy, xx) = in.at(i, c, z / s_, yy / s_, xx / s_);
    });
    R.store(y);
    return y;
  }
  V backward(Reference& R, const V& dy) override {
    V dx = x_.like(x_.c, x_.d, x_.h, x_.w, x_.low);
    each(dy, [&](int64_t i, int64_t c, int64_t z, int64_t yy, int64_t xx) {
      dx.at(i, c, z / s_, yy / s_, xx / s_) += dy.at(i, c, z, yy, xx);
    });
    R.store(dx);
    return dx;
  }

 private:
  // fn(i, c, z, y, x) over every element of the upsampled v.
  template <class F>
  static void each(const V& v, F&& fn) {
    for (int64_t i = 0; i < v.n; ++i)
      for (int64_t c = 0; c < v.c; ++c)
        for (int64_t z = 0; z < v.d; ++z)
          for (int64_t yy = 0; yy < v.h; ++yy)
            for (int64_t xx = 0; xx < v.w; ++xx) fn(i, c, z, yy, xx);
  }
  int64_t s_;
  V x_;
};

// AdaptiveAvgPool2d(1): (N, C, H, W) to (N, C, 1, 1); Flatten: to (N, F).
class GlobalAverage : public Op {
 public:
  std::string type() const override { return "AdaptiveAvgPool2d"; }
  V forward(Reference& R, const V& in) override {
    x_ = in;
    V y = in.like(in.c, 1, 1, 1, in.low);
    const int64_t s = in.spatial();
    for (int64_t i = 0; i < in.n * in.c; ++i) {
      double sum = 0;
      for (int64_t k = 0; k < s; ++k) sum += in.v[i * s + k];
      y.v[i] = sum / static_cast<double>(s);
    }
    R.store(y);
    return y;
  }
  V backward(Reference& R, const V& dy) override {
    V dx = x_.like(x_.c, x_.d, x_.h, x_.w, x_.low);
    const int64_t s = x_.spatial();
    for (int64_t i = 0; i < dx.n * dx.c; ++i)
      for (int64_t k = 0; k < s; ++k) dx.v[i * s + k] = dy.v[i] / static_cast<double>(s);
    R.store(dx);
    return dx;
  }

 private:
  V x_;
};
class Flatten : public Op {
 public:
  std::string type() const override { return "Flatten"; }
  V forward(Reference&, const V& in) override {
    x_ = in;
    V y = in;
    y.c = in.c * in.spatial();
    y.d = y.h = y.w = 1;
    return y;
  }
  V backward(Reference&, const V& dy) override {
    V dx = dy;
    dx.c = x_.c, dx.d = x_.d, dx.h = x_.h, dx.w = x_.w;
    return dx;
  }

 private:
  V x_;
};

// torchvision's BasicBlock: conv3x3(stride)-bn-relu-conv3x3-bn, plus the
// input or its downsample (conv1x1(stride)-bn), the sum rounded to the low
// type, then ReLU; dx is the two branches' dx added and rounded.
class Block : public Op {
 public:
  std::string type() const override { return "BasicBlock"; }
  Block(const std::string& n, int64_t stride, bool downsample) {
    main_.push_back(std::make_unique<Conv>(n + ".conv1", 2, 3, stride, 1, false));
    main_.push_back(std::make_unique<Norm>(n + ".bn1", 2, 0));
    main_.push_back(std::make_unique<Relu>());
    main_.push_back(std::make_unique<Conv>(n + ".conv2", 2, 3, 1, 1, false));
    main_.push_back(std::make_unique<Norm>(n + ".bn2", 2, 0));
    if (downsample) {
      short_.push_back(std::make_unique<Conv>(n + ".downsample.0", 2, 1, stride, 0, false));
      short_.push_back(std::make_unique<Norm>(n + ".downsample.1", 2, 0));
    }
  }
  V forward(Reference& R, const V& in) override {
    V a = run_forward(main_, R, in);
    const V b = run_forward(short_, R, in);
    for (size_t i = 0; i < a.v.size(); ++i) a.v[i] += b.v[i];
    R.store(a);
    return relu_.forward(R, a);
  }
  V backward(Reference& R, const V& dy) override {
    const V d = relu_.backward(R, dy);
    V dx = run_backward(main_, R, d);
    const V ds = run_backward(short_, R, d);
    for (size_t i = 0; i < dx.v.size(); ++i) dx.v[i] += ds.v[i];
    R.store(dx);
    return dx;
  }

 private:
  Ops main_, short_;
  Relu relu_;
};

inline V value_of(const Tensor& t) {
  V x;
  x.n = t.size(0);
  x.c = t.size(1);
  if (t.dim() >= 4) x.h = t.size(t.dim() - 2), x.w = t.size(t.dim() - 1);
  if (t.dim() == 5) x.d = t.size(2);
  x.v.assign(t.f32(), t.f32() + t.numel());
  return x;
}

// A tensor's values (any storage) and whether they are stored in a low type.
inline V value_of_stored(const Tensor& t) {
  V x = value_of(testing::float32_values(t));
  x.low = t.dtype() != DType::F32;
  return x;
}

// How our tensors compare with the reference's. Low-type values: how many
// are equal, and the largest difference in units of what one rounding may
// move a value: a spacing of the low type at the reference value, or, for a
// sum that cancels to a small result, float32's summation error at the
// size of its terms (2^-14 of the tensor's root mean square: sums of up to
// 1,000 terms). Every tensor: the relative difference by norm.
struct Agreement {
  int64_t equal = 0, total = 0;
  double worst_spacings = 0, worst_rel = 0;
  std::string at_spacings, at_rel;
  void add(const std::string& what, const Tensor& got_t, const V& want, DType t) {
    const Tensor got = testing::float32_values(got_t);
    ASSERT_EQ(got.numel(), static_cast<int64_t>(want.v.size())) << what;
    double d = 0, n = 0;
    for (size_t i = 0; i < want.v.size(); ++i) {
      d += std::pow(got.f32()[i] - want.v[i], 2);
      n += want.v[i] * want.v[i];
    }
    const double rel = n > 0 ? std::sqrt(d / n) : std::sqrt(d);
    if (rel > worst_rel) worst_rel = rel, at_rel = what;
    if (!want.low) return;
    const double summed = std::ldexp(std::sqrt(n / static_cast<double>(want.v.size())), -14);
    const int bits = t == DType::BF16 ? 8 : 11;
    const double tiny = t == DType::BF16 ? std::ldexp(1.0, -133) : std::ldexp(1.0, -24);  // the least subnormal
    for (size_t i = 0; i < want.v.size(); ++i) {
      ++total;
      const double g = got.f32()[i], w = want.v[i];
      if (g == w) {
        ++equal;
        continue;
      }
      const double spacing = std::max(std::ldexp(1.0, std::ilogb(std::max(std::abs(w), tiny)) - bits + 1), tiny);
      const double sp = std::abs(g - w) / std::max(spacing, summed);
      if (sp > worst_spacings) worst_spacings = sp, at_spacings = what;
    }
  }
  void print(const char* model, DType t, const char* what) const {
    std::printf("%-16s %-8s %-20s %7lld of %7lld low-type values equal, worst %.2f roundings (%s); by norm %.2g (%s)\n",
                model, dtype_name(t), what, static_cast<long long>(equal), static_cast<long long>(total),
                worst_spacings, at_spacings.c_str(), worst_rel, at_rel.c_str());
  }
};

}  // namespace fanout::ref64
