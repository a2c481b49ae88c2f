// Dropout, torch.nn.Dropout(p, inplace): in training each element is zeroed
// with probability p and the rest scaled by 1 / (1 - p); in evaluation the
// identity. The mask is a function of (the pass's key, the sample's row in
// the whole batch, the element) (kernels/dropout.h), so DataParallel and
// --split-invariant runs draw what one device draws, and backward redraws it
// instead of keeping it.
#pragma once
#include "runtime/nn/module.h"

namespace fanout::models {

class Dropout : public Module {
 public:
  explicit Dropout(float p = 0.5f, bool inplace = false);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override {
    auto m = std::make_unique<Dropout>(p_, inplace_);
    m->set_salt(salt_);
    return m;
  }
  std::string type_name() const override { return "Dropout"; }
  float p() const { return p_; }
  // Mixed into the pass's key, so that the dropout layers of one model draw
  // independent masks (a transformer has one per block; 0 by default).
  void set_salt(uint64_t salt) { salt_ = salt; }
  uint64_t salt() const { return salt_; }

 private:
  float p_;
  bool inplace_;
  bool applied_ = false;  // the last forward dropped (training, p > 0)
  uint64_t key_ = 0, salt_ = 0;
  int64_t row_ = 0, row_stride_ = 1;
  Tensor y_;
};

}  // namespace fanout::models
