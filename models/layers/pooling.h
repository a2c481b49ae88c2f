// Pooling layers: MaxPool2d, AvgPool2d (count_include_pad), AdaptiveAvgPool2d
// to 1x1.
#pragma once
#include "kernels/pool.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class MaxPool2d : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0) : g_{kernel, stride, padding} {}
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<MaxPool2d>(g_.kernel, g_.stride, g_.padding);
  }
  std::string type_name() const override { return "MaxPool2d"; }

 private:
  kernels::PoolGeometry g_;
  Shape in_shape_;
  Tensor y_, argmax_, dx_;
};

class AvgPool2d : public Module {
 public:
  AvgPool2d(int64_t kernel, int64_t stride, int64_t padding = 0) : g_{kernel, stride, padding} {}
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<AvgPool2d>(g_.kernel, g_.stride, g_.padding);
  }
  std::string type_name() const override { return "AvgPool2d"; }

 private:
  kernels::PoolGeometry g_;
  Shape in_shape_;
  Tensor y_, dx_;
};

// Output (N, C, 1, 1).
class AdaptiveAvgPool2d : public Module {
 public:
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override { return std::make_unique<AdaptiveAvgPool2d>(); }
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }

 private:
  Shape in_shape_;
  Tensor y_, dx_;
};

}  // namespace fanout::models
