// ConvTranspose2d / ConvTranspose3d, torch.nn.ConvTransposeNd(in, out,
// kernel, stride, padding, output_padding, bias) with groups 1 and dilation 1:
// the gradient of a convolution with respect to its input, used as a layer
// (decoders, U-Nets). Output size per axis (in - 1) * stride - 2 * padding +
// kernel + output_padding. Weight (in, out, kernel...) as torch lays it out,
// with torch's initialization (bounds from fan_in = out * kernel^dims).
// Computed by the convolution kernels: forward is a convolution's backward
// data, backward's dx a convolution forward and dW a convolution's weight
// gradient with the roles of input and output gradient swapped.
#pragma once
#include "runtime/nn/autocast.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class ConvTranspose : public Module {
 public:
  // spatial_dims 2 or 3; output_padding < stride.
  ConvTranspose(int spatial_dims, int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0,
                int64_t output_padding = 0, bool bias = true);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  void reset_parameters(std::mt19937_64& rng) override;
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<ConvTranspose>(dims_, in_, out_, k_, stride_, pad_, out_pad_, b_ != nullptr);
  }
  std::string type_name() const override { return dims_ == 2 ? "ConvTranspose2d" : "ConvTranspose3d"; }
  // The output shape for input shape x.
  Shape output_shape(const Shape& x) const;

 private:
  int dims_;
  int64_t in_, out_, k_, stride_, pad_, out_pad_;
  Parameter *w_, *b_ = nullptr;
  AutocastWeights autocast_;
  Tensor x_, y_, dx_;
};

}  // namespace fanout::models
