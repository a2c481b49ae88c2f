// Gradient clipping.
#include "runtime/optim/clip.h"

#include <algorithm>
#include <cmath>

#include "kernels/elementwise.h"
#include "kernels/optim.h"
#include "runtime/core/error.h"

namespace fanout::optim {

double clip_coefficient(double norm, double max_norm) { return std::min(1.0, max_norm / (norm + 1e-6)); }

double clip_grad_norm(Optimizer& opt, double max_norm) {
  FANOUT_USER_CHECK(std::isfinite(max_norm) && max_norm >= 0) << "invalid max norm " << max_norm << " for clipping";
  Tensor& g = opt.grads_for_step();
  const double norm = std::sqrt(kernels::sum_squares(opt.context(), g));
  if (!std::isfinite(norm)) return norm;
  const double coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0) kernels::scale(opt.context(), static_cast<float>(coef), g);
  return norm;
}

void clip_grad_value(Optimizer& opt, float limit) {
  FANOUT_USER_CHECK(std::isfinite(limit) && limit >= 0) << "invalid clip value " << limit;
  kernels::clamp_abs(opt.context(), opt.grads_for_step(), limit);
}

}  // namespace fanout::optim
