// Optimizers over a model's flat arenas. An Optimizer holds its state in
// arenas laid out like the parameters (so state can be saved by parameter
// name and cut by range), splits the parameters into groups by name (each
// with its weight decay and learning-rate scale) and runs one fused kernel
// per group and step. Engines never hold one: the training loop (the
// Trainer, or a user's own) steps it on the model whose gradients the
// engine has reduced.
//
//   auto opt = optim::make_optimizer(engine.model(), engine.step_context(), opts);
//   engine.forward_backward(x, y, 1.0f / rows, true);
//   optim::clip_grad_norm(*opt, 1.0);      // optional (runtime/optim/clip.h)
//   opt->step();
//   opt->zero_grad();
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/context.h"
#include "runtime/nn/module.h"

namespace fanout::optim {

// Parameters (by torch name) sharing a weight decay and a learning-rate scale.
struct ParamGroup {
  std::string name;
  std::vector<std::string> params;
  double weight_decay = 0;
  double lr_scale = 1;  // the group's learning rate is lr() * lr_scale
};

enum class OptimizerKind { SGD, Adam, AdamW };

// Elements [begin, end) of the parameter arena (end < 0: to its end): the
// part one optimizer steps and holds state for, a ZeRO-1 shard.
struct ArenaRange {
  int64_t begin = 0, end = -1;
};

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::SGD;
  // Hyper-parameters in double, as torch's Python holds them: the step's
  // scalars are computed from them in double and rounded to float once.
  float lr = 0.1f;            // the schedule's base rate (the Trainer reads initial_lr())
  double weight_decay = 0;    // SGD and Adam: L2 added to the gradient; AdamW: decoupled
  double momentum = 0, dampening = 0;            // SGD
  bool nesterov = false;                         // SGD
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam, AdamW
  bool amsgrad = false;                           // Adam, AdamW
  // Biases and other parameters of at most one dimension (norm weights) in
  // a group "no_decay" without weight decay (the common recipe); with
  // explicit groups, those of them no group names.
  bool no_decay_norm_bias = false;
  // Not a hyper-parameter: the range this optimizer owns (default all).
  ArenaRange range;
};

// Every kind comes from one table: its flag name ("sgd", "adam", "adamw")
// and torch's class name. parse_optimizer refuses a name not in it (one
// line), make_optimizer a kind not in it.
OptimizerKind parse_optimizer(const std::string& s);
const char* optimizer_name(OptimizerKind k);
// The flag names, in the table's order.
std::vector<std::string> optimizer_names();

// The interface the training loop steps: SGD, Adam and AdamW over one
// model's arena (ArenaOptimizer), or ZeRO's optimizer of many shards
// (runtime/train/sharded_optimizer.h).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const char* type() const { return optimizer_name(o_.kind); }
  OptimizerKind kind() const { return o_.kind; }
  // The base learning rate (each group's is lr() * its lr_scale).
  void set_lr(float lr);
  float lr() const { return lr_; }
  // The rate it was made with (torch's initial_lr): what a schedule scales.
  float initial_lr() const { return o_.lr; }
  const std::vector<ParamGroup>& groups() const { return groups_; }

  // One update of the parameters from their gradients (float64 gradients
  // are rounded to float once, here), on the optimizer's stream.
  virtual void step() = 0;
  // Zeros the gradients and waits for the optimizer's stream: when it
  // returns the parameters are final, for any engine to broadcast.
  virtual void zero_grad() = 0;
  // Updates taken; state exists from the first one on.
  int64_t steps() const { return steps_; }
  virtual void set_steps(int64_t s) { steps_ = s; }

  // The state arenas under torch's names ("momentum_buffer", "exp_avg",
  // "exp_avg_sq", "max_exp_avg_sq"), laid out like the parameter arena
  // (like its range, for a range optimizer); empty before the first step
  // (torch creates state on the first step). After writing into them (a
  // checkpoint's load), call state_written().
  virtual std::vector<std::pair<std::string, Tensor*>> state() = 0;
  virtual void state_written() {}
  // State sharded across processes: gather_state() brings every process's
  // shards to every process (a collective: all of them call it before a
  // checkpoint is written), and state_complete() says whether state() holds
  // all of it now. Always complete for state in one process.
  virtual void gather_state() {}
  virtual bool state_complete() const { return true; }
  // The names state() has once the optimizer has stepped.
  virtual std::vector<std::string> state_names() const = 0;
  // Bytes of state per device it lives on: one entry (this optimizer's
  // device), or one per shard for a sharded optimizer (the first also
  // counting the whole state assembled for checkpoints, once it exists).
  virtual std::vector<int64_t> state_bytes() const = 0;

  // What clipping and loss scaling do to the gradients the next step reads:
  // the sum of their squares (in double; non-finite exactly when an element
  // is), scaling by a, and clamping into [-limit, limit].
  virtual double grad_sum_squares() = 0;
  virtual void scale_grads(float a) = 0;
  virtual void clamp_grads(float limit) = 0;
  // Type and hyper-parameters (without the learning rate) and groups, as a
  // checkpoint records them.
  nlohmann::json hyper() const;
  // The model whose parameters end up updated (a sharded optimizer's: the
  // primary's, into which every shard is gathered).
  virtual Module& model() = 0;

 protected:
  // `groups`: every parameter in exactly one (complete_groups).
  Optimizer(const OptimizerOptions& o, std::vector<ParamGroup> groups);
  const OptimizerOptions& options() const { return o_; }

 private:
  OptimizerOptions o_;
  float lr_;
  std::vector<ParamGroup> groups_;
  int64_t steps_ = 0;
};

// An optimizer over one model's flat arenas (or a range of them, a ZeRO
// shard): a chunk table per group, state arenas laid out like the
// parameters, and one fused kernel per group and step (the kind's update).
class ArenaOptimizer : public Optimizer {
 public:
  void step() override;
  void zero_grad() override;
  std::vector<std::pair<std::string, Tensor*>> state() override;
  std::vector<std::string> state_names() const override;
  std::vector<int64_t> state_bytes() const override;
  double grad_sum_squares() override;
  void scale_grads(float a) override;
  void clamp_grads(float limit) override;

  Module& model() override { return model_; }
  // The context given at construction; a one-line error once it is gone (an
  // optimizer outliving its engine).
  Context& context();
  // The gradients the next step() reads: the model's arena (its range), or
  // the float32 copy of float64 ones once grads_for_step() has run.
  Tensor& grads_for_step();

 protected:
  // Every group of `model` (materialized; the optimizer works on its device
  // with ctx, which must outlive it). Parameters no group names form the
  // group "default" with o.weight_decay.
  ArenaOptimizer(Module& model, Context& ctx, const OptimizerOptions& o, std::vector<ParamGroup> groups);
  struct Group {
    Tensor chunks;  // kernels/optim.h's chunk table, on the device
    double weight_decay, lr_scale;
  };
  virtual void update(const Tensor& grads, const Group& g) = 0;
  // State arenas by name, allocated (zeroed) at construction.
  void add_state(const std::string& name);
  Tensor& state_arena(size_t i) { return state_[i].second; }
  // The parameters this optimizer updates: its range of the arena.
  Tensor params();

 private:
  Module& model_;
  Context& ctx_;
  std::weak_ptr<const void> ctx_alive_;
  std::vector<Group> chunks_;
  std::vector<std::pair<std::string, Tensor>> state_;
  int64_t begin_ = 0, end_ = 0;
  Tensor grad32_, grads_;
  bool rounded_ = false;  // grad32_ holds this step's rounded float64 gradients
};

// `groups` checked against `model` (a group naming an unknown parameter or
// one already in another group, a negative weight decay or learning-rate
// scale is a one-line error) and completed: parameters no group names form
// the group "default" (first) with o.weight_decay.
std::vector<ParamGroup> complete_groups(Module& model, const OptimizerOptions& o, std::vector<ParamGroup> groups);

// The groups make_optimizer uses: `groups`, and when o.no_decay_norm_bias
// a group "no_decay" of the no_decay_params no group in `groups` names.
std::vector<ParamGroup> resolve_groups(Module& model, const OptimizerOptions& o, std::vector<ParamGroup> groups);

// The optimizer `o` names, with resolve_groups' groups (none given: one
// "default" group, or "default" and "no_decay"). One-line errors for what
// torch refuses: lr, eps or weight decay below 0, betas outside [0, 1),
// Nesterov without momentum or with dampening, amsgrad with SGD, a group
// naming an unknown parameter or one already in another group.
std::unique_ptr<Optimizer> make_optimizer(Module& model, Context& ctx, const OptimizerOptions& o,
                                          std::vector<ParamGroup> groups = {});

// The parameters of the "no_decay" group: biases and every parameter of at
// most one dimension (BatchNorm and other norm weights), by name.
std::vector<std::string> no_decay_params(Module& model);

}  // namespace fanout::optim
