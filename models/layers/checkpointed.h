// Activation checkpointing (torch.utils.checkpoint's recomputation, as
// FSDP's checkpoint_wrapper applies it to a block): Checkpointed(block) keeps
// only the block's input and output; the activations its layers keep for
// backward live in buffers every checkpointed block of the replica shares
// (Context::checkpoint_slots), so a model holds one block's activations
// instead of all of them. Backward runs the block's forward again first.
//
// Results are bit for bit those without it: dropout draws from the pass's
// key, BatchNorm reuses the first forward's batch statistics without
// updating its running statistics or all-reducing again (SyncBatchNorm), and
// the block sees the same input. The wrapper adds no name: the block's
// parameters keep theirs (layer1.0.conv1.weight), as in a model without it.
// A checkpointed block inside another runs as a plain one. The block runs
// only through its wrapper: its buffers point into the shared slots.
#pragma once
#include <memory>

#include "runtime/nn/module.h"

namespace fanout::models {

class Checkpointed : public Module {
 public:
  explicit Checkpointed(std::unique_ptr<Module> block);
  std::string type_name() const override { return "Checkpointed"; }
  std::unique_ptr<Module> make_like() const override;
  void set_input_grad(bool on) override;
  // Forward keeps x, runs the block in the slots and copies its output out;
  // backward recomputes the block's forward, then runs its backward.
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;

 private:
  // The block's forward inside the shared slots, on a copy of x_ (a block
  // may overwrite its input in place).
  Tensor run(Context& ctx);

  Module* block_;
  Tensor x_;    // the input, the caller's buffer (kept for the recomputation)
  Tensor out_;  // the output, copied out of the slots
  bool plain_ = false;  // inside another checkpointed block: no slots, no recomputation
};

// `block` wrapped in Checkpointed when `on`, else itself.
std::unique_ptr<Module> checkpointed_if(bool on, std::unique_ptr<Module> block);

}  // namespace fanout::models
