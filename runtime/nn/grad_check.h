// Gradient check of a module on the CPU, the way fanout tests its own
// layers: loss = sum(r * m(x)) for random x and r; backward's input
// gradient and every parameter's gradient against central differences of
// the loss (float32 steps of eps), each error scaled by the largest analytic
// entry (float32 differences carry absolute noise, so a relative error of a
// near-zero entry says nothing); entries whose one-sided differences
// disagree (a kink: ReLU, max) are skipped. backward runs through
// Module::backward_of, so a layer that forgets notify_grads_ready fails too.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/nn/module.h"

namespace fanout {

struct GradCheck {
  double input_error = 0;  // scaled, as above; 0 when the module returns no input gradient
  bool input_grad = false;  // backward returned one
  std::vector<std::pair<std::string, double>> param_errors;  // per parameter, by name
  std::vector<std::string> zero_grads;  // gradients that came back all zeros (input and parameters)
  // The largest error, and a line per gradient for messages.
  double worst() const;
  std::string report() const;
};

// m on the CPU (materialized there with init(seed) first when it is not),
// in training mode; `input` the shape of x.
GradCheck check_gradients(Module& m, const Shape& input, uint64_t seed = 1, double eps = 1e-3);

}  // namespace fanout
