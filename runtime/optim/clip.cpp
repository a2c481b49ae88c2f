// Gradient clipping.
#include "runtime/optim/clip.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/error.h"

namespace fanout::optim {

double clip_coefficient(double norm, double max_norm) { return std::min(1.0, max_norm / (norm + 1e-6)); }

double clip_grad_norm(Optimizer& opt, double max_norm) {
  FANOUT_USER_CHECK(std::isfinite(max_norm) && max_norm >= 0) << "invalid max norm " << max_norm << " for clipping";
  const double norm = std::sqrt(opt.grad_sum_squares());
  if (!std::isfinite(norm)) return norm;
  const double coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0) opt.scale_grads(static_cast<float>(coef));
  return norm;
}

void clip_grad_value(Optimizer& opt, float limit) {
  FANOUT_USER_CHECK(std::isfinite(limit) && limit >= 0) << "invalid clip value " << limit;
  opt.clamp_grads(limit);
}

}  // namespace fanout::optim
