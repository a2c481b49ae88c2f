// Loss scaler.
#include "runtime/optim/grad_scaler.h"

#include <cmath>

#include "runtime/core/error.h"

namespace fanout::optim {

GradScaler::GradScaler(const GradScalerOptions& o) : o_(o), scale_(o.init_scale) {
  FANOUT_USER_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0)
      << "the initial loss scale must be positive and finite, got " << o.init_scale;
  FANOUT_USER_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1)
      << "the loss scale's growth factor must be above 1, got " << o.growth_factor;
  FANOUT_USER_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1)
      << "the loss scale's backoff factor must be in (0, 1), got " << o.backoff_factor;
  FANOUT_USER_CHECK(o.growth_interval >= 1) << "the loss scale's growth interval must be at least 1, got "
                                            << o.growth_interval;
}

bool GradScaler::unscale(Optimizer& opt) {
  FANOUT_CHECK(stage_ == Stage::Ready) << "unscale() was already called for this step";
  found_inf_ = !std::isfinite(opt.grad_sum_squares());
  if (!found_inf_) opt.scale_grads(static_cast<float>(1.0 / static_cast<double>(scale_)));
  stage_ = Stage::Unscaled;
  return !found_inf_;
}

bool GradScaler::step(Optimizer& opt) {
  if (stage_ == Stage::Ready) unscale(opt);
  const bool stepped = !found_inf_;
  if (stepped) opt.step();
  update(found_inf_);
  stage_ = Stage::Ready;
  return stepped;
}

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= o_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_;
    return;
  }
  if (++growth_tracker_ == o_.growth_interval) {
    const float grown = scale_ * o_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;  // torch keeps the scale when growing would overflow
    growth_tracker_ = 0;
  }
}

nlohmann::json GradScaler::state() const {
  return {{"scale", scale_}, {"growth_tracker", growth_tracker_}, {"skipped", skipped_}};
}

void GradScaler::load_state(const nlohmann::json& j) {
  FANOUT_USER_CHECK(j.is_object() && j.contains("scale") && j["scale"].is_number() && j.contains("growth_tracker") &&
                    j["growth_tracker"].is_number_integer() && j.contains("skipped") &&
                    j["skipped"].is_number_integer())
      << "the loss scaler's state is malformed: " << j.dump();
  const float s = j["scale"].get<float>();
  const int64_t t = j["growth_tracker"].get<int64_t>();
  FANOUT_USER_CHECK(std::isfinite(s) && s > 0 && t >= 0 && t < o_.growth_interval && j["skipped"].get<int64_t>() >= 0)
      << "the loss scaler's state is out of range: " << j.dump();
  scale_ = s;
  growth_tracker_ = t;
  skipped_ = j["skipped"].get<int64_t>();
  stage_ = Stage::Ready;
}

}  // namespace fanout::optim
