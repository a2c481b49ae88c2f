// Gradient check by central differences.
#include "runtime/nn/grad_check.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <sstream>

#include "runtime/core/context.h"
#include "runtime/core/error.h"

namespace fanout {

namespace {

Tensor uniform(const Shape& s, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(s);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = u(rng);
  return t;
}

double norm(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += double(t.f32()[i]) * t.f32()[i];
  return std::sqrt(s);
}

// Largest |numerical - analytic| over (up to 300) entries of t, relative to max |analytic|.
double scaled_error(const std::function<double()>& f, Tensor& t, const Tensor& g, double eps) {
  double scale = 1e-3;
  for (int64_t i = 0; i < g.numel(); ++i) scale = std::max(scale, std::abs(double(g.f32()[i])));
  const int64_t step = std::max<int64_t>(1, t.numel() / 300);
  double worst = 0;
  for (int64_t i = 0; i < t.numel(); i += step) {
    const float o = t.f32()[i];
    t.f32()[i] = o + float(eps);
    const double fp = f();
    t.f32()[i] = o - float(eps);
    const double fm = f();
    t.f32()[i] = o;
    const double f0 = f();
    const double right = (fp - f0) / eps, left = (f0 - fm) / eps;
    if (std::abs(right - left) > 0.05 * scale) continue;  // a kink inside [o - eps, o + eps]
    worst = std::max(worst, std::abs((fp - fm) / (2 * eps) - g.f32()[i]) / scale);
  }
  return worst;
}

}  // namespace

double GradCheck::worst() const {
  double w = input_error;
  for (auto& [n, e] : param_errors) w = std::max(w, e);
  return w;
}

std::string GradCheck::report() const {
  std::ostringstream o;
  o << "input gradient: " << (input_grad ? std::to_string(input_error) : std::string("none"));
  for (auto& [n, e] : param_errors) o << "; " << n << ": " << e;
  for (auto& n : zero_grads) o << "; " << n << " is all zeros";
  return o.str();
}

GradCheck check_gradients(Module& m, const Shape& input, uint64_t seed, double eps) {
  if (!m.materialized()) m.init(seed);
  FANOUT_USER_CHECK(m.device().is_cpu()) << "check_gradients runs on the CPU; the module is on " << m.device().str();
  m.train(true);
  Context ctx(Device::cpu(), seed);
  std::mt19937_64 rng(seed + 1);
  Tensor x = uniform(input, rng);
  const Tensor y0 = m.forward(x, ctx);
  const Tensor r = uniform(y0.shape(), rng);
  auto loss = [&]() {
    const Tensor y = m.forward(x, ctx);
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += double(y.f32()[i]) * r.f32()[i];
    return s;
  };
  GradCheck out;
  m.zero_grad();
  m.forward(x, ctx);
  Tensor dy = r.to(Device::cpu());  // a copy: backward may overwrite dy (the Module contract), r stays the loss's
  const Tensor dx = Module::backward_of(m, m.type_name(), dy, ctx);
  if (dx.defined()) {
    out.input_grad = true;
    const Tensor dx_copy = dx.to(Device::cpu());
    if (norm(dx_copy) == 0) out.zero_grads.push_back("input gradient");
    out.input_error = scaled_error(loss, x, dx_copy, eps);
  }
  const Tensor grads = m.arenas().grads.to(Device::cpu());
  for (auto& [name, p] : m.named_parameters()) {
    const Tensor g = grads.flat(p->offset, p->shape).to(Device::cpu());
    if (norm(g) == 0) out.zero_grads.push_back(name + " gradient");
    out.param_errors.emplace_back(name, scaled_error(loss, p->value, g, eps));
  }
  return out;
}

}  // namespace fanout
