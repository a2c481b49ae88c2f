// Heatmap rendering (kernels/heatmap.h) on every backend, bit for bit against
// the naive per-voxel CPU reference (render_heatmaps_naive), sample by sample:
// 2D and 3D, landmarks near, across and beyond the borders, radius 0,
// overlapping landmarks and shared channels, non-default sigma, radii whose
// factor table is too large for the CUDA launch parameters, more landmarks
// than one CUDA block gathers at once, seeded random cases, empty shapes,
// what each backend does with bad coordinates and channels, and the
// argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/heatmap.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;
using kernels::HeatmapParams;

class HeatmapKernel : public ft::BackendTest {
 protected:
  // The op on this backend: host inputs up, a poisoned output, the result
  // back on the host.
  Tensor render(const Tensor& landmarks, const HeatmapParams& p, const Shape& out_shape,
                const Tensor& channels = Tensor()) {
    Tensor lm = up(landmarks);
    Tensor out = poisoned(out_shape);
    Tensor ch = channels.defined() ? up(channels) : Tensor();
    kernels::render_heatmaps(ctx(), lm, p, out, channels.defined() ? &ch : nullptr);
    return down(out);
  }

  // Renders and compares with the reference; `what` names the case.
  void expect_reference(const Tensor& landmarks, const HeatmapParams& p, const Shape& out_shape,
                        const Tensor& channels = Tensor(), const std::string& what = "") {
    SCOPED_TRACE(::testing::Message() << what << " landmarks " << landmarks.shape().str() << " out "
                                      << out_shape.str() << " radius " << p.radius << " sigma " << p.sigma
                                      << (channels.defined() ? " shared channels" : ""));
    const Tensor got = render(landmarks, p, out_shape, channels);
    const Tensor want = reference(landmarks, p, out_shape, channels);
    EXPECT_TRUE(same(got, want));
  }

  // render_heatmaps_naive on each sample.
  static Tensor reference(const Tensor& landmarks, const HeatmapParams& p, const Shape& out_shape,
                          const Tensor& channels) {
    Tensor out = Tensor::empty(out_shape);
    Shape sample = out_shape;  // (C, ...) of one sample
    for (int i = 0; i + 1 < out_shape.ndim; ++i) sample[i] = out_shape[i + 1];
    sample.ndim = out_shape.ndim - 1;
    const Shape lm_sample{landmarks.size(1), landmarks.size(2)};
    for (int64_t n = 0; n < out_shape[0]; ++n) {
      kernels::render_heatmaps_naive(landmarks.slice(n, n + 1).view(lm_sample), p, out.slice(n, n + 1).view(sample),
                                     channels);
    }
    return out;
  }

  // Same bits, or the first element that differs.
  static ::testing::AssertionResult same(const Tensor& got, const Tensor& want) {
    if (got.shape() != want.shape())
      return ::testing::AssertionFailure() << "shape " << got.shape().str() << " vs " << want.shape().str();
    for (int64_t i = 0; i < got.numel(); ++i) {
      if (std::memcmp(got.f32() + i, want.f32() + i, sizeof(float)) != 0)
        return ::testing::AssertionFailure() << "element " << i << ": " << got.f32()[i] << " vs "
                                             << want.f32()[i] << " (bits differ)";
    }
    return ::testing::AssertionSuccess();
  }
};
FANOUT_ON_EVERY_BACKEND(HeatmapKernel);

// (N, K, S) from rows of N * K landmarks.
Tensor landmarks_of(int64_t n, const std::vector<std::vector<float>>& rows) {
  const Tensor t = ft::f32_rows(rows);
  return t.view(Shape{n, t.size(0) / n, t.size(1)});
}
Tensor channels_of(const std::vector<int32_t>& c) { return ft::i32_values(c); }

// (N, K, S) landmarks for a volume of sizes `vol`, per coordinate one of:
// inside, across the low or the high border, beyond the window's reach, or
// on a half voxel (where floor(c + 0.5) rounds up).
Tensor random_landmarks(int64_t n, int64_t k, const std::vector<int64_t>& vol, int r, std::mt19937_64& rng) {
  const int s = static_cast<int>(vol.size());
  Tensor t = Tensor::empty(Shape{n, k, s});
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const float rf = static_cast<float>(r);
  for (int64_t i = 0; i < n * k; ++i)
    for (int a = 0; a < s; ++a) {
      const float len = static_cast<float>(vol[a]);
      float v;
      switch (rng() % 8) {
        case 0: v = -rf - 1.0f + u(rng) * (rf + 1.5f); break;
        case 1: v = len - 1.0f + u(rng) * (rf + 1.5f); break;
        case 2: v = u(rng) < 0.5f ? -rf - 2.0f - 50.0f * u(rng) : len + rf + 1.0f + 50.0f * u(rng); break;
        case 3: v = static_cast<float>(rng() % vol[a]) - 0.5f; break;
        default: v = -0.5f + u(rng) * len; break;
      }
      t.f32()[i * s + a] = v;
    }
  return t;
}

// Runs f, expecting a one-line fanout::Error naming the op and holding `part`.
void expect_one_line_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    EXPECT_NE(msg.find("render_heatmaps"), std::string::npos) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
    return;
  }
  ADD_FAILURE() << "nothing thrown, expected an error with '" << part << "'";
}

TEST_P(HeatmapKernel, Matches2DNearAndAcrossBorders) {
  // 19 x 23, radius 4: inside, on half voxels, near each border, across
  // them, beyond the window's reach, and one landmark per sample on a corner.
  const Tensor lm = landmarks_of(2, {{9.3f, 11.7f},
                                     {4.5f, 7.5f},
                                     {0.2f, 22.4f},
                                     {-2.6f, 3.1f},
                                     {20.5f, 25.4f},
                                     {-30.0f, 5.0f},
                                     {5.0f, 100.0f},
                                     {18.0f, 0.0f},
                                     // sample 1
                                     {-4.49f, -4.49f},
                                     {22.4f, 10.0f},
                                     {-4.51f, 10.0f},
                                     {9.0f, 26.5f},
                                     {18.6f, 22.6f},
                                     {1e30f, 3.0f},
                                     {-1e30f, -1e30f},
                                     {3.0f, 3.0f}});
  expect_reference(lm, {4, 0}, Shape{2, 8, 19, 23});
  expect_reference(lm, {1, 0}, Shape{2, 8, 19, 23});
}

TEST_P(HeatmapKernel, Matches3DNearAndAcrossBorders) {
  const Tensor lm = landmarks_of(2, {{4.2f, 6.6f, 5.1f},
                                     {0.0f, 0.0f, 0.0f},
                                     {-2.5f, 12.9f, 3.0f},
                                     {8.7f, -1.2f, 11.4f},
                                     {30.0f, 6.0f, 5.0f},
                                     // sample 1
                                     {4.5f, 6.5f, 5.5f},
                                     {-3.49f, 15.4f, -3.4f},
                                     {11.5f, 6.0f, 5.0f},
                                     {8.0f, 12.0f, 10.0f},
                                     {2.0f, -40.0f, 2.0f}});
  expect_reference(lm, {3, 0}, Shape{2, 5, 9, 13, 11});
  expect_reference(lm, {2, 0}, Shape{2, 5, 9, 13, 11});
}

TEST_P(HeatmapKernel, RadiusZeroDrawsOneVoxel) {
  // -0.5 rounds to voxel 0 (inside), -0.51 to voxel -1 (outside): three ones.
  const Tensor lm = landmarks_of(1, {{2.4f, 3.6f}, {-0.5f, 0.0f}, {-0.51f, 1.0f}, {4.49f, 5.49f}});
  const Shape shape{1, 4, 5, 6};
  expect_reference(lm, {0, 0}, shape);
  const Tensor got = render(lm, {0, 0}, shape);
  auto at = [&](int64_t c, int64_t y, int64_t x) { return got.f32()[(c * 5 + y) * 6 + x]; };
  double sum = 0;
  for (int64_t i = 0; i < got.numel(); ++i) sum += got.f32()[i];
  EXPECT_EQ(sum, 3.0);
  EXPECT_EQ(at(0, 2, 4), 1.0f);
  EXPECT_EQ(at(1, 0, 0), 1.0f);
  EXPECT_EQ(at(3, 4, 5), 1.0f);
}

TEST_P(HeatmapKernel, OverlappingLandmarksAndSharedChannels) {
  // Five landmarks into three channels; channel 1 gets none and stays 0.
  const Tensor ch = channels_of({0, 2, 0, 0, 2});
  const Tensor lm2 = landmarks_of(2, {{5.0f, 5.0f},
                                      {5.0f, 6.0f},
                                      {6.4f, 7.3f},
                                      {5.0f, 5.0f},
                                      {-1.0f, 9.0f},
                                      // sample 1
                                      {0.0f, 0.0f},
                                      {0.4f, 0.6f},
                                      {2.0f, 1.0f},
                                      {15.0f, 15.0f},
                                      {1.0f, 0.0f}});
  expect_reference(lm2, {3, 0}, Shape{2, 3, 12, 14}, ch, "2D");
  const Tensor got = render(lm2, {3, 0}, Shape{2, 3, 12, 14}, ch);
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t i = 0; i < 12 * 14; ++i) EXPECT_EQ(got.f32()[(n * 3 + 1) * 12 * 14 + i], 0.0f);

  const Tensor lm3 = landmarks_of(1, {{3.0f, 4.0f, 4.0f},
                                      {3.0f, 4.0f, 5.0f},
                                      {3.5f, 4.5f, 4.5f},
                                      {2.2f, 4.0f, 3.6f},
                                      {3.0f, 4.0f, 4.0f}});
  expect_reference(lm3, {2, 1.5}, Shape{1, 3, 7, 9, 8}, ch, "3D");
  // Every landmark in one channel.
  expect_reference(lm3, {4, 0}, Shape{1, 1, 7, 9, 8}, channels_of({0, 0, 0, 0, 0}), "3D one channel");
}

TEST_P(HeatmapKernel, NonDefaultSigma) {
  std::mt19937_64 rng(11);
  const Tensor lm3 = random_landmarks(2, 4, {10, 12, 9}, 5, rng);
  const Tensor lm2 = random_landmarks(3, 3, {30, 17}, 5, rng);
  // Tiny sigma: factors underflow to subnormals and 0. Huge: every factor near 1.
  for (double sigma : {0.05, 0.3, 0.999, 1.7, 4.0, 50.0, 1e6}) {
    expect_reference(lm3, {5, sigma}, Shape{2, 4, 10, 12, 9}, Tensor(), "3D");
    expect_reference(lm2, {5, sigma}, Shape{3, 3, 30, 17}, Tensor(), "2D");
  }
}

TEST_P(HeatmapKernel, LargeRadii) {
  // Factor tables of 701 and 65537 entries (beyond what CUDA passes in its
  // launch parameters); the windows cover the whole volume.
  std::mt19937_64 rng(12);
  const Tensor lm = random_landmarks(2, 3, {21, 40}, 700, rng);
  expect_reference(lm, {700, 0}, Shape{2, 3, 21, 40});
  expect_reference(lm, {700, 90.0}, Shape{2, 3, 21, 40});
  const Tensor near = landmarks_of(1, {{3.0f, 4.0f, 5.0f}, {-65000.0f, 2.0f, 9.0f}, {7.0f, 70000.0f, 1.0f}});
  expect_reference(near, {kernels::kMaxHeatmapRadius, 0}, Shape{1, 3, 6, 7, 11});
  expect_reference(near, {kernels::kMaxHeatmapRadius, 3.0}, Shape{1, 3, 6, 7, 11});
}

TEST_P(HeatmapKernel, ManyLandmarksPerChannel) {
  // More landmarks than a CUDA block gathers at once (256), all in one or two
  // channels; and as many channels as landmarks.
  std::mt19937_64 rng(13);
  const Tensor lm = random_landmarks(2, 600, {64, 48}, 3, rng);
  std::vector<int32_t> c(600);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<int32_t>(i % 7 == 0);
  expect_reference(lm, {3, 0}, Shape{2, 2, 64, 48}, channels_of(c), "two channels");
  expect_reference(lm, {2, 0}, Shape{2, 1, 64, 48}, channels_of(std::vector<int32_t>(600, 0)), "one channel");
  const Tensor lm3 = random_landmarks(1, 300, {6, 7, 9}, 2, rng);
  expect_reference(lm3, {2, 0}, Shape{1, 300, 6, 7, 9}, Tensor(), "a channel each");
}

TEST_P(HeatmapKernel, RandomAgainstReference) {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 60; ++trial) {
    const bool three = rng() % 2;
    const bool big = trial % 6 == 0;  // volumes of many CUDA tiles, slices not aligned to them
    std::vector<int64_t> vol;
    for (int a = 0; a < (three ? 3 : 2); ++a)
      vol.push_back(1 + static_cast<int64_t>(rng() % (big ? (three ? 40 : 150) : (three ? 12 : 24))));
    const int r = static_cast<int>(rng() % 9);
    const double sigma = rng() % 3 == 0 ? 0.2 + 5.0 * std::uniform_real_distribution<double>(0, 1)(rng) : 0.0;
    const int64_t n = 1 + static_cast<int64_t>(rng() % 3);
    const int64_t k = static_cast<int64_t>(rng() % 8);
    const Tensor lm = random_landmarks(n, k, vol, r, rng);
    Tensor channels;
    int64_t c = k;
    if (rng() % 2) {
      c = 1 + static_cast<int64_t>(rng() % 4);
      std::vector<int32_t> ch(static_cast<size_t>(k));
      for (auto& v : ch) v = static_cast<int32_t>(rng() % static_cast<uint64_t>(c));
      channels = channels_of(ch);
    }
    Shape shape = three ? Shape{n, c, vol[0], vol[1], vol[2]} : Shape{n, c, vol[0], vol[1]};
    expect_reference(lm, {r, sigma}, shape, channels, "trial " + std::to_string(trial));
  }
}

TEST_P(HeatmapKernel, EmptyShapes) {
  // No landmarks: every channel is written with zeros.
  const Tensor none = Tensor::empty(Shape{2, 0, 2});
  expect_reference(none, {2, 0}, Shape{2, 3, 4, 5}, channels_of({}), "no landmarks");
  const Tensor got = render(none, {2, 0}, Shape{2, 3, 4, 5}, channels_of({}));
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.f32()[i], 0.0f);
  // Nothing to write.
  const Tensor lm = landmarks_of(1, {{1.0f, 2.0f}});
  EXPECT_EQ(render(lm, {2, 0}, Shape{1, 1, 0, 5}).numel(), 0);
  EXPECT_EQ(render(Tensor::empty(Shape{0, 1, 3}), {2, 0}, Shape{0, 1, 4, 4, 4}).numel(), 0);
}

TEST_P(HeatmapKernel, BadCoordinatesAndChannels) {
  // The CPU backend checks them (one-line errors of the renderer); the CUDA
  // backend does not read them on the host: such a landmark draws nothing.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Tensor lm = landmarks_of(2, {{2.0f, 3.0f}, {nan, 1.0f}, {inf, 2.0f}, {4.0f, 4.0f}});
  const Tensor ch_ok = channels_of({0, 1});
  const Shape shape{2, 2, 6, 7};
  const Tensor ch_bad = channels_of({0, 2});
  const Tensor lm_ok = landmarks_of(1, {{2.0f, 3.0f}, {4.0f, 4.0f}});
  const Shape shape1{1, 2, 6, 7};
  if (!on_cuda()) {
    expect_one_line_error([&] { render(lm, {2, 0}, shape, ch_ok); }, "non-finite coordinate");
    expect_one_line_error([&] { render(lm_ok, {2, 0}, shape1, ch_bad); }, "outside 0..1");
    return;
  }
  // What the reference draws with those landmarks far outside / left out.
  Tensor far = landmarks_of(2, {{2.0f, 3.0f}, {-1e30f, 1.0f}, {-1e30f, 2.0f}, {4.0f, 4.0f}});
  EXPECT_TRUE(same(render(lm, {2, 0}, shape, ch_ok), reference(far, {2, 0}, shape, ch_ok)));
  const Tensor got = render(lm_ok, {2, 0}, shape1, ch_bad);
  const Tensor want = reference(landmarks_of(1, {{2.0f, 3.0f}, {-1e30f, 4.0f}}), {2, 0}, shape1, ch_ok);
  EXPECT_TRUE(same(got, want));
}

TEST_P(HeatmapKernel, ArgumentErrors) {
  const Tensor lm = up(Tensor::zeros(Shape{2, 3, 2}));
  Tensor out = up(Tensor::zeros(Shape{2, 3, 5, 6}));
  const Tensor ch = up(channels_of({0, 1, 1}));
  auto call = [&](const Tensor& l, const HeatmapParams& p, Tensor& o, const Tensor* c = nullptr) {
    kernels::render_heatmaps(ctx(), l, p, o, c);
  };
  EXPECT_NO_THROW(call(lm, {2, 0}, out));
  EXPECT_NO_THROW(call(lm, {2, 0}, out, &ch));
  expect_one_line_error([&] { call(lm, {-1, 0}, out); }, "radius -1");
  expect_one_line_error([&] { call(lm, {kernels::kMaxHeatmapRadius + 1, 0}, out); }, "radius 65537");
  expect_one_line_error([&] { call(lm, {2, -0.5}, out); }, "sigma");
  expect_one_line_error([&] { call(lm, {2, std::nan("")}, out); }, "sigma");
  expect_one_line_error([&] { call(lm, {2, std::numeric_limits<double>::infinity()}, out); }, "sigma");

  Tensor out3 = up(Tensor::zeros(Shape{3, 5, 6}));
  expect_one_line_error([&] { call(up(Tensor::zeros(Shape{3, 2})), {2, 0}, out3); }, "must be (N, C, H, W)");
  expect_one_line_error([&] { call(up(Tensor::zeros(Shape{3, 2})), {2, 0}, out); }, "must be (N, K, 2)");
  expect_one_line_error([&] { call(up(Tensor::zeros(Shape{2, 3, 3})), {2, 0}, out); }, "must be (N, K, 2)");
  expect_one_line_error([&] { call(up(Tensor::zeros(Shape{1, 3, 2})), {2, 0}, out); }, "must be (N, K, 2)");
  Tensor out5 = up(Tensor::zeros(Shape{2, 3, 4, 5, 6}));
  expect_one_line_error([&] { call(lm, {2, 0}, out5); }, "must be (N, K, 3)");
  Tensor out_c = up(Tensor::zeros(Shape{2, 4, 5, 6}));
  expect_one_line_error([&] { call(lm, {2, 0}, out_c); }, "4 channels for 3 landmarks");
  const Tensor ch_f32 = up(Tensor::zeros(Shape{3}));
  expect_one_line_error([&] { call(lm, {2, 0}, out, &ch_f32); }, "int32");
  const Tensor ch_short = up(channels_of({0, 1}));
  expect_one_line_error([&] { call(lm, {2, 0}, out, &ch_short); }, "must be (3)");
  const Tensor ch_2d = up(Tensor::zeros(Shape{3, 1}, DType::I32));
  expect_one_line_error([&] { call(lm, {2, 0}, out, &ch_2d); }, "must be (3)");
  const Tensor lm_i32 = up(Tensor::zeros(Shape{2, 3, 2}, DType::I32));
  expect_one_line_error([&] { call(lm_i32, {2, 0}, out); }, "float32");
  Tensor out_i32 = up(Tensor::zeros(Shape{2, 3, 5, 6}, DType::I32));
  expect_one_line_error([&] { call(lm, {2, 0}, out_i32); }, "float32");
  const Tensor undefined;
  expect_one_line_error([&] { call(undefined, {2, 0}, out); }, "undefined");
  if (on_cuda()) {
    // Host tensors with a CUDA context.
    const Tensor lm_host = Tensor::zeros(Shape{2, 3, 2});
    expect_one_line_error([&] { call(lm_host, {2, 0}, out); }, "context is on cuda");
    const Tensor ch_host = channels_of({0, 1, 1});
    expect_one_line_error([&] { call(lm, {2, 0}, out, &ch_host); }, "context is on cuda");
  }
}

}  // namespace
}  // namespace fanout
