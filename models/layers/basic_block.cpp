// ResNet basic block.
#include "models/layers/basic_block.h"

#include "kernels/elementwise.h"
#include "runtime/nn/autocast.h"

namespace fanout::models {

BasicBlock::BasicBlock(int64_t in, int64_t out, int64_t stride) : in_(in), out_(out), stride_(stride) {
  using I = Conv2d::Init;
  conv1_ = &register_module("conv1", std::make_unique<Conv2d>(in, out, 3, stride, 1, false, I::KaimingNormalFanOut));
  bn1_ = &register_module("bn1", std::make_unique<BatchNorm2d>(out));
  register_module("relu", std::make_unique<ReLU>(/*inplace=*/true));  // run by bn1 (forward_add_relu)
  conv2_ = &register_module("conv2", std::make_unique<Conv2d>(out, out, 3, 1, 1, false, I::KaimingNormalFanOut));
  bn2_ = &register_module("bn2", std::make_unique<BatchNorm2d>(out));
  if (stride != 1 || in != out) {
    auto ds = std::make_unique<Sequential>();
    ds->add(std::make_unique<Conv2d>(in, out, 1, stride, 0, false, I::KaimingNormalFanOut));
    ds->add(std::make_unique<BatchNorm2d>(out));
    downsample_ = &register_module("downsample", std::move(ds));
  }
}

std::unique_ptr<Module> BasicBlock::make_like() const {
  auto b = std::make_unique<BasicBlock>(in_, out_, stride_);
  b->set_input_grad(input_grad());
  return b;
}

void BasicBlock::set_input_grad(bool on) {
  Module::set_input_grad(on);
  conv1_->set_input_grad(on);
  if (downsample_) downsample_->set_input_grad(on);
}

Tensor BasicBlock::forward(const Tensor& x, Context& ctx) {
  Tensor h = conv1_->forward(x, ctx);
  h = bn1_->forward_add_relu(h, nullptr, ctx);  // bn1 and the in-place ReLU in one pass
  h = conv2_->forward(h, ctx);
  // The residual add pairs elements in one memory format.
  const Tensor shortcut = in_format_of(ctx, downsample_ ? downsample_->forward(x, ctx) : x, h, shortcut_);
  // bn2, the residual add (low under autocast) and the ReLU in one pass, into bn2's output.
  return bn2_->forward_add_relu(h, &shortcut, ctx);
}

Tensor BasicBlock::backward(const Tensor& dy, Context& ctx) {
  Tensor dsum = bn2_->relu_grad(dy, ctx);  // d(main + shortcut), with bn2's gradient sums
  // Shortcut first: its parameters come last in the arena, so their gradients
  // are ready earliest in backward order.
  Tensor dshort = downsample_ ? Module::backward_of(*downsample_, "downsample", dsum, ctx) : dsum;
  Tensor g = Module::backward_of(*bn2_, "bn2", dsum, ctx);
  g = Module::backward_of(*conv2_, "conv2", g, ctx);
  g = Module::backward_of(*bn1_, "bn1", g, ctx);  // with the ReLU's mask
  g = Module::backward_of(*conv1_, "conv1", g, ctx);
  if (!input_grad()) return Tensor();
  dshort = in_format_of(ctx, dshort, g, dshortcut_);
  kernels::add(ctx, g, dshort, g, g.dtype());  // conv1's input gradient, in its type: nothing reads it after this
  return g;
}

}  // namespace fanout::models
