// Shared test helpers.
#include "support/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/convert.h"
#include "runtime/core/context.h"
#include "runtime/core/error.h"
#include "runtime/data/dataset.h"

namespace fanout::testing {

Tensor random_tensor(const Shape& s, std::mt19937_64& rng, float lo, float hi) {
  Tensor t = Tensor::empty(s);
  std::uniform_real_distribution<float> u(lo, hi);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return t;
}

Tensor random_ids(int64_t b, int64_t t, int v, std::mt19937_64& rng, bool some_ignored) {
  Tensor ids = Tensor::empty(Shape{b, t}, DType::I32);
  std::uniform_int_distribution<int> u(0, v - 1);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int32_t>()[i] = some_ignored && i % 5 == 3 ? -1 : u(rng);
  return ids;
}

Tensor random_heatmaps(const Shape& s, std::mt19937_64& rng) {
  Tensor t = random_tensor(s, rng, 0.0f, 0.05f);
  const int64_t planes = s[0] * s[1], voxels = t.numel() / planes;
  for (int64_t p = 0; p < planes; ++p) t.f32()[p * voxels + static_cast<int64_t>(rng() % voxels)] = 1.0f;
  return t;
}

Tensor random_labels(int64_t n, int classes, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(Shape{n}, DType::I32);
  std::uniform_int_distribution<int> u(0, classes - 1);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = u(rng);
  return t;
}

Tensor f32_rows(const std::vector<std::vector<float>>& rows) {
  const size_t cols = rows.at(0).size();
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(rows.size()), static_cast<int64_t>(cols)});
  for (size_t i = 0; i < rows.size(); ++i) {
    FANOUT_CHECK(rows[i].size() == cols) << "f32_rows: row " << i << " has " << rows[i].size() << " values, not " << cols;
    std::copy(rows[i].begin(), rows[i].end(), t.f32() + i * cols);
  }
  return t;
}

Tensor i32_values(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(v.size())}, DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

void poison(Tensor& t) {
  if (t.dtype() == DType::F32) t.fill(std::numeric_limits<float>::quiet_NaN());
  if (t.dtype() == DType::F64 && t.device().is_cpu())
    std::fill(t.f64(), t.f64() + t.numel(), std::numeric_limits<double>::quiet_NaN());
}

BnReference bn_reference(const Tensor& x, double eps, double momentum) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  const double count = static_cast<double>(n * s);
  BnReference r;
  r.y.resize(static_cast<size_t>(x.numel()));
  for (int64_t ch = 0; ch < c; ++ch) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) m += x.f32()[(i * c + ch) * s + k];
    m /= count;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) {
        const double d = x.f32()[(i * c + ch) * s + k] - m;
        v += d * d;
      }
    v /= count;  // biased, for normalizing
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) {
        const int64_t j = (i * c + ch) * s + k;
        r.y[static_cast<size_t>(j)] = (x.f32()[j] - m) / std::sqrt(v + eps);
      }
    r.running_mean.push_back(momentum * m);
    r.running_var.push_back((1 - momentum) + momentum * v * count / (count - 1));
  }
  return r;
}

Tensor offset_channels(const Shape& s, const std::vector<double>& offsets, double spread, std::mt19937_64& rng) {
  Tensor x = random_tensor(s, rng, -1.0f, 1.0f);
  const int64_t n = s[0], c = s[1], per = x.numel() / (n * c);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t k = 0; k < per; ++k) {
        float& v = x.f32()[(i * c + ch) * per + k];
        v = static_cast<float>(offsets[static_cast<size_t>(ch) % offsets.size()] * spread + v * spread);
      }
  return x;
}

double max_rel_diff(const Tensor& a, const std::vector<double>& b) {
  FANOUT_CHECK(a.numel() == static_cast<int64_t>(b.size())) << a.shape().str() << " vs " << b.size() << " values";
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = std::abs(static_cast<double>(a.f32()[i]) - b[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, d);
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  FANOUT_CHECK(a.numel() == b.numel()) << a.shape().str() << " vs " << b.shape().str();
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.f32()[i], y = b.f32()[i];
    double d = std::abs(x - y) / std::max(1.0, std::abs(y));
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    m = std::max(m, d);
  }
  return m;
}

NormReference norm_reference(const Tensor& x, const Tensor& g, const Tensor& b, const Tensor& dy, int64_t m,
                             double eps, const std::function<int64_t(int64_t, int64_t)>& affine) {
  NormReference r;
  r.y.resize(x.numel());
  r.dx.resize(x.numel());
  r.dgamma.assign(g.numel(), 0.0);
  r.dbeta.assign(g.numel(), 0.0);
  const float *xp = x.f32(), *dp = dy.f32(), *gp = g.f32(), *bp = b.f32();
  for (int64_t row = 0; row < x.numel() / m; ++row) {
    const float* xr = xp + row * m;
    const float* dr = dp + row * m;
    double mu = 0, var = 0;
    for (int64_t k = 0; k < m; ++k) mu += xr[k];
    mu /= static_cast<double>(m);
    for (int64_t k = 0; k < m; ++k) var += (xr[k] - mu) * (xr[k] - mu);
    var /= static_cast<double>(m);
    r.mean.push_back(mu);
    r.rstd.push_back(1 / std::sqrt(var + eps));
    // The ops keep their statistics in float (as torch does) and normalize
    // with those: with two values per row and a variance near eps the
    // rounding of the mean alone moves dx by 1e-5.
    const double muf = static_cast<float>(mu), rs = static_cast<float>(r.rstd.back());
    double sd = 0, sdx = 0;
    for (int64_t k = 0; k < m; ++k) {
      const int64_t a = affine(row, k);
      const double xh = (xr[k] - muf) * rs;
      r.y[row * m + k] = xh * gp[a] + bp[a];
      sd += dr[k] * gp[a];
      sdx += dr[k] * gp[a] * xh;
      r.dgamma[a] += dr[k] * xh;
      r.dbeta[a] += dr[k];
    }
    for (int64_t k = 0; k < m; ++k) {
      const double xh = (xr[k] - muf) * rs;
      r.dx[row * m + k] = rs * (dr[k] * gp[affine(row, k)] - sd / m - xh * sdx / m);
    }
  }
  return r;
}

double l2_norm(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += double(t.f32()[i]) * t.f32()[i];
  return std::sqrt(s);
}

GradCheckResult grad_check_detail(const std::function<double()>& f, Tensor& x, const Tensor& analytic, double eps,
                                  double kink_tol, int max_entries) {
  FANOUT_CHECK(x.numel() == analytic.numel()) << "gradient shape mismatch";
  const int64_t n = x.numel();
  const int64_t step = std::max<int64_t>(1, n / max_entries);
  GradCheckResult r;
  float* p = x.f32();
  for (int64_t i = 0; i < n; i += step) {
    const float orig = p[i];
    p[i] = orig + static_cast<float>(eps);
    const double fp = f();
    p[i] = orig - static_cast<float>(eps);
    const double fm = f();
    p[i] = orig;
    const double f0 = f();
    const double right = (fp - f0) / eps, left = (f0 - fm) / eps;
    if (std::abs(right - left) > kink_tol * std::max(1.0, std::abs(right) + std::abs(left))) {  // kink
      ++r.skipped;
      continue;
    }
    const double num = (fp - fm) / (2 * eps);
    const double ana = analytic.f32()[i];
    const double err = std::abs(num - ana) / std::max({1e-2, std::abs(num), std::abs(ana)});
    r.worst = std::max(r.worst, std::isnan(err) ? std::numeric_limits<double>::infinity() : err);
    ++r.checked;
  }
  return r;
}

double grad_check(const std::function<double()>& f, Tensor& x, const Tensor& analytic, double eps, double kink_tol,
                  int max_entries) {
  return grad_check_detail(f, x, analytic, eps, kink_tol, max_entries).worst;
}

double dot(const Tensor& a, const Tensor& b) {
  FANOUT_CHECK(a.numel() == b.numel()) << a.shape().str() << " vs " << b.shape().str();
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += double(a.f32()[i]) * b.f32()[i];
  return s;
}

Tensor clone(const Tensor& t) { return t.to(Device::cpu()); }

Tensor float32_values(const Tensor& t) {
  const bool low = t.dtype() == DType::BF16 || t.dtype() == DType::F16;
  if (!low && !t.channels_last()) return t;
  Context ctx(Device::cpu());
  Tensor out = Tensor::empty(t.shape());
  kernels::convert(ctx, t, out);
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

bool same_data(const data::ImageDataset& a, const data::ImageDataset& b) {
  const auto same_optional = [](const Tensor& x, const Tensor& y) {
    return x.defined() == y.defined() && (!x.defined() || same_bits(x, y));
  };
  return same_bits(a.images, b.images) && same_optional(a.labels, b.labels) &&
         same_optional(a.landmarks, b.landmarks) && a.mean == b.mean && a.std == b.std;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string expect_user_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const fanout::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    EXPECT_EQ(msg.find(" failed at "), std::string::npos) << "internal check, not a user error: " << msg;
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected fanout::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected fanout::Error, nothing was thrown";
  return "";
}


std::vector<Batch> random_batches(const Shape& sample, int64_t rows, int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Batch> out;
  Shape batch;  // (rows, sample...)
  batch.ndim = sample.ndim + 1;
  batch.d[0] = rows;
  for (int i = 0; i < sample.ndim; ++i) batch.d[i + 1] = sample.d[i];
  for (int s = 0; s < steps; ++s) out.push_back({random_tensor(batch, rng), random_labels(rows, 10, rng)});
  return out;
}

}  // namespace fanout::testing
