// Shared test helpers: seeded random tensors, poisoning, comparisons,
// central-difference gradient checks.
#pragma once
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace fanout::data {
struct ImageDataset;
}  // namespace fanout::data

namespace fanout::testing {

// Seeded uniform [lo, hi) values; never all zeros.
Tensor random_tensor(const Shape& s, std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f);
Tensor random_labels(int64_t n, int classes, std::mt19937_64& rng);
// Dense heatmap targets (N, K, spatial...): noise in [0, 0.05) and one peak of
// 1 at a random voxel of every (row, landmark) plane.
Tensor random_heatmaps(const Shape& s, std::mt19937_64& rng);
// (b, t) int32 token ids uniform in [0, v); with some_ignored every fifth (i % 5 == 3) is -1.
Tensor random_ids(int64_t b, int64_t t, int v, std::mt19937_64& rng, bool some_ignored = false);

// `steps` seeded batches of `rows` samples of shape `sample` (C, H, W) with
// labels in [0, 10).
struct Batch {
  Tensor x, y;
};
std::vector<Batch> random_batches(const Shape& sample, int64_t rows, int steps, uint64_t seed);
// Host tensors of the given values: (rows, columns) float32 from equal-length
// rows, and (n) int32.
Tensor f32_rows(const std::vector<std::vector<float>>& rows);
Tensor i32_values(const std::vector<int32_t>& v);
// Fills with NaN so unwritten outputs are caught.
void poison(Tensor& t);
// max |a - b| / max(1, |b|), elementwise.
double max_rel_diff(const Tensor& a, const Tensor& b);

// Training-mode BatchNorm (torch's formulas) in float64 on CPU float input
// (N, C, ...): the output with weight 1, bias 0, and the running statistics
// after one update from mean 0, var 1 with `momentum` (unbiased variance).
struct BnReference {
  std::vector<double> y, running_mean, running_var;
};
BnReference bn_reference(const Tensor& x, double eps, double momentum);
// Inputs whose channel c has mean offsets[c % size] * spread and the given
// spread: the stress case of BatchNorm's statistics.
Tensor offset_channels(const Shape& s, const std::vector<double>& offsets, double spread, std::mt19937_64& rng);
// max |a - b| / max |b| of a float tensor against float64 values.
double max_rel_diff(const Tensor& a, const std::vector<double>& b);
// torch's normalization over rows of m values (GroupNorm's (sample, group),
// LayerNorm's rows) and its gradients, in float64 from the statistics as the
// ops keep them (float): row r's value k is scaled and shifted by
// g[affine(r, k)] and b[affine(r, k)]; dgamma and dbeta have g's size.
struct NormReference {
  std::vector<double> y, mean, rstd, dx, dgamma, dbeta;
};
NormReference norm_reference(const Tensor& x, const Tensor& g, const Tensor& b, const Tensor& dy, int64_t m,
                             double eps, const std::function<int64_t(int64_t, int64_t)>& affine);
double l2_norm(const Tensor& t);

// Numerical gradient of a scalar function f() with respect to the float32
// tensor `x` (modified in place and restored), by central differences.
// Returns the largest relative error against `analytic`, skipping entries
// where f has a kink (the one-sided slopes differ by more than `kink_tol`).
double grad_check(const std::function<double()>& f, Tensor& x, const Tensor& analytic, double eps = 1e-2,
                  double kink_tol = 1e-2, int max_entries = 200);

// grad_check with its bookkeeping, so a test can also assert that enough
// entries were compared (not all skipped as kinks).
struct GradCheckResult {
  double worst = 0;  // largest relative error over the compared entries
  int checked = 0;   // entries compared
  int skipped = 0;   // entries skipped as kinks
};
GradCheckResult grad_check_detail(const std::function<double()>& f, Tensor& x, const Tensor& analytic,
                                  double eps = 1e-2, double kink_tol = 1e-2, int max_entries = 200);

// sum_i a_i * b_i in double (a scalar loss L = <r, y> has dL/dy = r).
double dot(const Tensor& a, const Tensor& b);
// A CPU copy of t (its dtype and format).
Tensor clone(const Tensor& t);
// A host tensor's values in the logical order as float32: t itself when it is
// float32 (or not floating) and contiguous, else a widened copy (bfloat16,
// float16, channels-last: a model's output under autocast).
Tensor float32_values(const Tensor& t);
// Same shape, dtype and bytes (CPU tensors).
bool same_bits(const Tensor& a, const Tensor& b);
// The same bytes in every part of two data sets: images, labels or
// landmarks (whichever they hold), mean and std.
bool same_data(const data::ImageDataset& a, const data::ImageDataset& b);

// The message of the fanout::Error f throws, or "(no error)".
std::string error_of(const std::function<void()>& f);
// Runs f, expecting a fanout::Error whose message is one line and contains
// every string in `parts`; returns the message (empty after a failure).
std::string expect_user_error(const std::function<void()>& f, const std::vector<std::string>& parts);

}  // namespace fanout::testing
