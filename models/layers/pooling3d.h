// Volumetric pooling layers over (N, C, D, H, W): MaxPool3d and AvgPool3d
// (torch.nn.MaxPool3d / AvgPool3d: cubic window, floor mode; average with
// count_include_pad).
#pragma once
#include "kernels/pool3d.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class MaxPool3d : public Module {
 public:
  MaxPool3d(int64_t kernel, int64_t stride, int64_t padding = 0);
  explicit MaxPool3d(int64_t kernel) : MaxPool3d(kernel, kernel) {}  // torch's default stride = kernel
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<MaxPool3d>(g_.kernel, g_.stride, g_.padding);
  }
  std::string type_name() const override { return "MaxPool3d"; }

 private:
  kernels::PoolGeometry g_;
  Shape in_shape_;
  Tensor y_, argmax_, dx_;
};

class AvgPool3d : public Module {
 public:
  AvgPool3d(int64_t kernel, int64_t stride, int64_t padding = 0);
  explicit AvgPool3d(int64_t kernel) : AvgPool3d(kernel, kernel) {}  // torch's default stride = kernel
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<AvgPool3d>(g_.kernel, g_.stride, g_.padding);
  }
  std::string type_name() const override { return "AvgPool3d"; }

 private:
  kernels::PoolGeometry g_;
  Shape in_shape_;
  Tensor y_, dx_;
};

}  // namespace fanout::models
