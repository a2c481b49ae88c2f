// Gradient clipping on the fully reduced gradient (call it between the
// engine's last forward_backward of a step and Optimizer::step(), so every
// rank and replica count sees the same gradient):
// torch.nn.utils.clip_grad_norm_ and clip_grad_value_ over every parameter.
#pragma once
#include "runtime/optim/optimizer.h"

namespace fanout::optim {

// Total L2 norm of every parameter's gradient (accumulated in double); when
// finite, multiplies the gradients by min(1, max_norm / (norm + 1e-6)), as
// torch does. Returns the norm before clipping; a non-finite norm is
// returned without touching the gradients (the caller decides: the Trainer
// stops with an error). max_norm >= 0.
double clip_grad_norm(Optimizer& opt, double max_norm);
// The coefficient clip_grad_norm applies for a total norm: min(1, max_norm / (norm + 1e-6)).
double clip_coefficient(double norm, double max_norm);
// Clamps every gradient element into [-limit, limit]; limit >= 0.
void clip_grad_value(Optimizer& opt, float limit);

}  // namespace fanout::optim
