// Activation checkpointing (see checkpointed.h).
#include "models/layers/checkpointed.h"

#include "runtime/core/error.h"

namespace fanout::models {

namespace {
// Slots and the recomputation flag on for one scope, off again on any exit.
class SlotScope {
 public:
  SlotScope(Context& ctx, bool recomputing) : ctx_(ctx) {
    ctx.slots = &ctx.checkpoint_slots();
    ctx.slots->restart();
    ctx.recomputing = recomputing;
  }
  ~SlotScope() {
    ctx_.slots = nullptr;
    ctx_.recomputing = false;
  }
  SlotScope(const SlotScope&) = delete;
  SlotScope& operator=(const SlotScope&) = delete;

 private:
  Context& ctx_;
};
}  // namespace

Checkpointed::Checkpointed(std::unique_ptr<Module> block) {
  FANOUT_CHECK(block) << "Checkpointed(null)";
  block_ = &register_module("", std::move(block));
}

std::unique_ptr<Module> Checkpointed::make_like() const {
  auto c = std::make_unique<Checkpointed>(block_->make_like());
  c->set_input_grad(input_grad());
  return c;
}

void Checkpointed::set_input_grad(bool on) {
  Module::set_input_grad(on);
  block_->set_input_grad(on);
}

Tensor Checkpointed::run(Context& ctx) {
  Tensor work;
  ensure_like(work, x_, ctx);  // its format too: a channels-last input under autocast
  work.copy_from(x_, &ctx.compute());
  return block_->forward(work, ctx);
}

Tensor Checkpointed::forward(const Tensor& x, Context& ctx) {
  plain_ = ctx.slots != nullptr;
  if (plain_) return block_->forward(x, ctx);
  x_ = x;
  SlotScope scope(ctx, false);
  const Tensor y = run(ctx);
  ensure(out_, y.shape(), y.dtype(), ctx.device(), y.format());
  out_.copy_from(y, &ctx.compute());
  return out_;
}

Tensor Checkpointed::backward(const Tensor& dy, Context& ctx) {
  if (plain_) return backward_of(*block_, "checkpointed block", dy, ctx);
  FANOUT_CHECK(x_.defined()) << "Checkpointed: backward before forward";
  ActivationSlots& slots = ctx.checkpoint_slots();
  // dy may be the next checkpointed block's input gradient, in the slots.
  Tensor& g = slots.grad_in();
  ensure(g, dy.shape(), dy.dtype(), ctx.device(), dy.format());
  if (g.raw() != dy.raw()) g.copy_from(dy, &ctx.compute());
  SlotScope scope(ctx, true);
  run(ctx);
  ctx.recomputing = false;
  return backward_of(*block_, "checkpointed block", g, ctx);
}

std::unique_ptr<Module> checkpointed_if(bool on, std::unique_ptr<Module> block) {
  if (!on) return block;
  return std::make_unique<Checkpointed>(std::move(block));
}

}  // namespace fanout::models
