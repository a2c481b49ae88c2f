// ResNet basic block (torchvision.models.resnet.BasicBlock):
//   out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)),
// shortcut = downsample (1x1 conv stride s + BatchNorm) when the shape changes.
// As torchvision's, both ReLUs work in place; each batch norm runs with the
// ReLU after it (and bn2 with the residual add) as one pass
// (BatchNormNd::forward_add_relu), backward masks dy in place and adds the
// shortcut's gradient into conv1's input gradient, so the block keeps no
// buffer of its own. The ReLU module "relu" holds no state; it stays for
// torchvision's module names.
#pragma once
#include "models/layers/activation.h"
#include "models/layers/batchnorm.h"
#include "models/layers/conv.h"
#include "models/layers/sequential.h"

namespace fanout::models {

class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in, int64_t out, int64_t stride);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override;
  std::string type_name() const override { return "BasicBlock"; }
  void set_input_grad(bool on) override;

 private:
  int64_t in_, out_, stride_;
  Conv2d* conv1_;
  BatchNorm2d* bn1_;
  Conv2d* conv2_;
  BatchNorm2d* bn2_;
  Sequential* downsample_ = nullptr;
  // The identity shortcut and its gradient in the other operand's memory
  // format, where the block's input is not stored as its layers' outputs
  // are (a low-type contiguous input under autocast).
  Tensor shortcut_, dshortcut_;
};

}  // namespace fanout::models
