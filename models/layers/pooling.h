// Pooling layers over (N, C, H, W) and (N, C, D, H, W): MaxPool2d, AvgPool2d,
// MaxPool3d and AvgPool3d (torch.nn's: square / cubic window, floor mode;
// average with count_include_pad), one layer for both kinds and ranks; and
// AdaptiveAvgPool2d to 1x1.
#pragma once
#include "kernels/pool.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class PoolNd : public Module {
 public:
  enum class Kind { Max, Avg };
  // spatial: 2 or 3; padding at most half the kernel (a one-line error otherwise).
  PoolNd(Kind kind, int spatial, int64_t kernel, int64_t stride, int64_t padding);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::string type_name() const override;

 protected:
  Kind kind_;
  int spatial_;
  kernels::PoolGeometry g_;

 private:
  TensorSpec in_;
  Tensor y_, argmax_, dx_;
};

// The named kinds and ranks; stride defaults to the kernel, as torch's.
template <PoolNd::Kind K, int Spatial>
class Pool final : public PoolNd {
 public:
  Pool(int64_t kernel, int64_t stride, int64_t padding = 0) : PoolNd(K, Spatial, kernel, stride, padding) {}
  explicit Pool(int64_t kernel) : Pool(kernel, kernel) {}
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<Pool>(g_.kernel, g_.stride, g_.padding);
  }
};
using MaxPool2d = Pool<PoolNd::Kind::Max, 2>;
using AvgPool2d = Pool<PoolNd::Kind::Avg, 2>;
using MaxPool3d = Pool<PoolNd::Kind::Max, 3>;
using AvgPool3d = Pool<PoolNd::Kind::Avg, 3>;

// Output (N, C, 1, 1).
class AdaptiveAvgPool2d : public Module {
 public:
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override { return std::make_unique<AdaptiveAvgPool2d>(); }
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }

 private:
  TensorSpec in_;
  Tensor y_, dx_;
};

}  // namespace fanout::models
