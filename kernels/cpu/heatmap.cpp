// CPU heatmaps: argument checks, the separable renderer and the naive
// per-voxel reference, and the CPU backend of the op (the batch renderer).
// Both renderers evaluate a voxel's value with the same float operations in
// the same order, (factor_z * factor_y) * factor_x, so they agree bit for bit;
// 2D is 3D with one slice and factor_z = 1.
#include "kernels/heatmap.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/loops.h"
#include "runtime/core/error.h"


namespace fanout::kernels {

namespace {

// The peak is 1 (every factor at offset 0 is exp(0) = 1); values below this are 0.
constexpr float kThreshold = std::numeric_limits<float>::epsilon();

// One sample, validated: landmarks and output as raw arrays, 2D as D = 1.
struct Sample {
  int s = 0;                         // spatial dims of the coordinates, 2 or 3
  int64_t vol[3] = {1, 1, 1};        // (D, H, W)
  int64_t k = 0, c = 0;              // landmarks, channels
  const float* coords = nullptr;     // (K, S)
  const int32_t* channel = nullptr;  // (K), or null: landmark k draws into channel k (or 0 when merged)
  bool merged = false;               // every landmark into channel 0
  float* out = nullptr;              // (C, D, H, W)

  int64_t channel_of(int64_t l) const { return merged ? 0 : channel ? channel[l] : l; }
  int64_t voxels() const { return vol[0] * vol[1] * vol[2]; }
};

void zero(const Sample& x) {
  const size_t bytes = static_cast<size_t>(x.c * x.voxels()) * sizeof(float);
  if (bytes) std::memset(x.out, 0, bytes);
}

// The per-axis factor of offset d, f[|d|] (f = heatmap_axis_factors).
float axis_factor(const std::vector<float>& f, int64_t d) { return f[static_cast<size_t>(d < 0 ? -d : d)]; }

// The landmark's voxel per axis (z, y, x) in double (exact for every float
// coordinate); z = 0 in 2D.
void centers(const Sample& x, int64_t l, double c[3]) {
  c[0] = 0;
  const float* p = x.coords + l * x.s;
  for (int a = 0; a < x.s; ++a) c[3 - x.s + a] = std::floor(static_cast<double>(p[a]) + 0.5);
}

// row[i] = max(row[i], g) with g = fzy * fx[i], or 0 below the threshold:
// no branches, so it vectorizes.
inline void max_row(float* __restrict row, const float* __restrict fx, float fzy, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = fzy * fx[i];
    const float g = v < kThreshold ? 0.0f : v;
    row[i] = row[i] < g ? g : row[i];
  }
}

// out_c (D, H, W) = max(out_c, gaussian) over the window [lo, hi] per axis;
// f points at the factor of offset 0 (f[-r..r] valid), c is the center.
// Also built for AVX2 (loops.h): it multiplies, compares and selects.
FANOUT_AVX2_CLONE void draw_window(float* out_c, const int64_t vol[3], const int64_t lo[3], const int64_t hi[3],
                                   const int64_t c[3], const float* f) {
  const int64_t nx = hi[2] - lo[2] + 1;
  const float* fx = f + (lo[2] - c[2]);
  for (int64_t z = lo[0]; z <= hi[0]; ++z) {
    const float fz = f[z - c[0]];
    for (int64_t y = lo[1]; y <= hi[1]; ++y)
      max_row(out_c + (z * vol[1] + y) * vol[2] + lo[2], fx, fz * f[y - c[1]], nx);
  }
}

void render_fast(const Sample& x, const HeatmapParams& spec) {
  zero(x);
  const int64_t r = spec.radius;
  const std::vector<float> f = heatmap_axis_factors(spec);
  std::vector<float> table(static_cast<size_t>(2 * r + 1));  // factor of offset d at [d + r]
  for (int64_t d = -r; d <= r; ++d) table[static_cast<size_t>(d + r)] = axis_factor(f, d);
  for (int64_t l = 0; l < x.k; ++l) {
    double cd[3];
    centers(x, l, cd);
    int64_t c[3], lo[3], hi[3];
    bool inside = true;
    for (int a = 0; a < 3; ++a) {
      // In double first: the center may be far outside int64's range.
      inside = inside && cd[a] + static_cast<double>(r) >= 0 && cd[a] - static_cast<double>(r) <= x.vol[a] - 1;
      if (!inside) break;
      c[a] = static_cast<int64_t>(cd[a]);
      lo[a] = std::max<int64_t>(c[a] - r, 0);
      hi[a] = std::min<int64_t>(c[a] + r, x.vol[a] - 1);
    }
    if (!inside) continue;  // the window misses the volume
    draw_window(x.out + x.channel_of(l) * x.voxels(), x.vol, lo, hi, c, table.data() + r);
  }
}

void render_naive(const Sample& x, const HeatmapParams& spec) {
  zero(x);
  const double r = spec.radius;
  const std::vector<float> f = heatmap_axis_factors(spec);
  for (int64_t l = 0; l < x.k; ++l) {
    double c[3];
    centers(x, l, c);
    float* o = x.out + x.channel_of(l) * x.voxels();
    for (int64_t z = 0; z < x.vol[0]; ++z)
      for (int64_t y = 0; y < x.vol[1]; ++y)
        for (int64_t xx = 0; xx < x.vol[2]; ++xx, ++o) {
          const double dz = static_cast<double>(z) - c[0], dy = static_cast<double>(y) - c[1],
                       dx = static_cast<double>(xx) - c[2];
          float g = 0.0f;
          if (std::abs(dz) <= r && std::abs(dy) <= r && std::abs(dx) <= r) {
            g = axis_factor(f, static_cast<int64_t>(dz)) * axis_factor(f, static_cast<int64_t>(dy)) *
                axis_factor(f, static_cast<int64_t>(dx));
            if (g < kThreshold) g = 0.0f;
          }
          *o = std::max(*o, g);
        }
  }
}

void check_spec(const HeatmapParams& spec, const char* who) {
  FANOUT_USER_CHECK(spec.radius >= 0 && spec.radius <= kMaxHeatmapRadius)
      << who << ": radius " << spec.radius << " is outside 0.." << kMaxHeatmapRadius;
  FANOUT_USER_CHECK(std::isfinite(spec.sigma) && spec.sigma >= 0)
      << who << ": sigma " << spec.sigma << " must be finite and >= 0 (0: (2 * radius + 1) / 6)";
}

void check_cpu_f32(const Tensor& t, const char* name, const char* who) {
  FANOUT_USER_CHECK(t.defined()) << who << ": " << name << " is undefined";
  FANOUT_USER_CHECK(t.device().is_cpu()) << who << ": " << name << " must be a CPU tensor";
  FANOUT_USER_CHECK(t.dtype() == DType::F32) << who << ": " << name << " must be float32, not " << dtype_name(t.dtype());
}

// Checks the coordinates (finite) and channel indices of a sample.
void check_sample(const Sample& x, const char* who) {
  for (int64_t i = 0; i < x.k * x.s; ++i) {
    FANOUT_USER_CHECK(std::isfinite(x.coords[i]))
        << who << ": landmark " << i / x.s << " has a non-finite coordinate (" << x.coords[i] << ")";
  }
  if (!x.channel) return;
  for (int64_t l = 0; l < x.k; ++l) {
    FANOUT_USER_CHECK(x.channel[l] >= 0 && x.channel[l] < x.c)
        << who << ": landmark " << l << " has channel " << x.channel[l] << ", outside 0.." << x.c - 1;
  }
}

// Validates (landmarks (N, K, S) or (K, S), out (N, C, ...) or (C, ...)) and
// returns sample 0 with the strides to step to sample n.
struct Plan {
  Sample first;
  int64_t n = 1;
  int64_t coords_stride = 0, out_stride = 0;  // elements per sample
};

Plan plan(const Tensor& landmarks, const HeatmapParams& spec, const Tensor& out, const Tensor& channels, bool batch,
          bool merged, const char* who) {
  check_spec(spec, who);
  check_cpu_f32(landmarks, "landmarks", who);
  check_cpu_f32(out, "out", who);
  const int lead = batch ? 1 : 0;                  // the N dim
  const int spatial = out.dim() - lead - (merged ? 0 : 1);
  FANOUT_USER_CHECK(spatial == 2 || spatial == 3)
      << who << ": out " << out.shape().str() << " must be "
      << (batch ? "(N, C, H, W) or (N, C, D, H, W)" : merged ? "(H, W) or (D, H, W)" : "(C, H, W) or (C, D, H, W)");
  FANOUT_USER_CHECK(landmarks.dim() == 2 + lead && landmarks.size(-1) == spatial)
      << who << ": landmarks " << landmarks.shape().str() << " must be " << (batch ? "(N, K, " : "(K, ") << spatial
      << ") for out " << out.shape().str();
  Plan p;
  Sample& x = p.first;
  x.s = spatial;
  x.merged = merged;
  for (int a = 0; a < spatial; ++a) x.vol[3 - spatial + a] = out.size(out.dim() - spatial + a);
  x.k = landmarks.size(lead);
  x.c = merged ? 1 : out.size(lead);
  if (batch) {
    FANOUT_USER_CHECK(landmarks.size(0) == out.size(0))
        << who << ": landmarks " << landmarks.shape().str() << " and out " << out.shape().str()
        << " hold different batch sizes";
  }
  p.n = batch ? out.size(0) : 1;
  if (channels.defined()) {
    FANOUT_USER_CHECK(channels.device().is_cpu() && channels.dtype() == DType::I32 && channels.dim() == 1 &&
                      channels.size(0) == x.k)
        << who << ": channels must be a CPU int32 tensor (" << x.k << "), not " << dtype_name(channels.dtype()) << " "
        << channels.shape().str();
    x.channel = channels.data<int32_t>();
  } else if (!merged) {
    FANOUT_USER_CHECK(x.c == x.k) << who << ": out " << out.shape().str() << " has " << x.c << " channels for " << x.k
                                  << " landmarks (pass channel indices to share channels)";
  }
  x.coords = landmarks.data<float>();
  x.out = out.data<float>();
  p.coords_stride = x.k * x.s;
  p.out_stride = x.c * x.voxels();
  for (int64_t i = 0; i < p.n; ++i) {
    Sample xi = x;
    xi.coords += i * p.coords_stride;
    check_sample(xi, who);
  }
  return p;
}

template <class Render>
void run(const Plan& p, const HeatmapParams& spec, Render render) {
  for (int64_t i = 0; i < p.n; ++i) {
    Sample x = p.first;
    x.coords += i * p.coords_stride;
    x.out += i * p.out_stride;
    render(x, spec);
  }
}

}  // namespace

void render_heatmaps(const Tensor& landmarks, const HeatmapParams& spec, const Tensor& out, const Tensor& channels) {
  run(plan(landmarks, spec, out, channels, false, false, "render_heatmaps"), spec, render_fast);
}

void render_heatmaps_naive(const Tensor& landmarks, const HeatmapParams& spec, const Tensor& out,
                           const Tensor& channels) {
  run(plan(landmarks, spec, out, channels, false, false, "render_heatmaps_naive"), spec, render_naive);
}

void render_heatmap_merged(const Tensor& landmarks, const HeatmapParams& spec, const Tensor& out) {
  run(plan(landmarks, spec, out, Tensor(), false, true, "render_heatmap_merged"), spec, render_fast);
}

void render_heatmaps_batch(const Tensor& landmarks, const HeatmapParams& spec, const Tensor& out,
                           const Tensor& channels) {
  run(plan(landmarks, spec, out, channels, true, false, "render_heatmaps_batch"), spec, render_fast);
}

namespace cpu {

void render_heatmaps(Context&, const Tensor& landmarks, const HeatmapParams& p, Tensor& out,
                     const Tensor* channels) {
  kernels::render_heatmaps_batch(landmarks, p, out, channels ? *channels : Tensor());
}

}  // namespace cpu

}  // namespace fanout::kernels
