// Transforms: the --augment spec, normalization, and load_sample's crop and
// flip: exact mirror, identity at padding 0, shifted content with normalized
// zero padding, draws a pure function of (seed, epoch, index) with p = 0.5.
#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

#include "data/pipeline_test_util.h"
#include "runtime/data/transforms.h"
#include "support/test_util.h"

namespace fanout::data {
namespace {

using namespace fanout::testing;  // random datasets and checks

constexpr int64_t kC = 3, kH = 5, kW = 7, kPer = kC * kH * kW;

std::vector<float> sample(const ImageDataset& ds, int64_t i, const Augment& a, uint64_t seed, int64_t epoch) {
  std::vector<float> out(kPer, -1e30f);
  load_sample(ds, i, a, seed, epoch, out.data());
  return out;
}

std::vector<float> plain(const ImageDataset& ds, int64_t i) {
  std::vector<float> out(kPer, -1e30f);
  ds.normalized(i, out.data());
  return out;
}

// Channel c's normalized zero, as ImageDataset::normalized computes it for a zero pixel.
float normalized_zero(const ImageDataset& ds, int64_t c) {
  ImageDataset z;
  z.images = Tensor::zeros(Shape{1, kC, 1, 1}, DType::U8);
  z.labels = Tensor::zeros(Shape{1}, DType::I32);
  z.mean = ds.mean;
  z.std = ds.std;
  float v[kC];
  z.normalized(0, v);
  return v[c];
}

// plain(i) mirrored (optionally) then shifted: output (y, x) reads (y + dy, x' + dx), x' = flip ? W-1-x : x.
std::vector<float> moved(const ImageDataset& ds, int64_t i, bool flip, int64_t dy, int64_t dx) {
  const auto p = plain(ds, i);
  std::vector<float> out(kPer);
  for (int64_t c = 0; c < kC; ++c) {
    const float zero = normalized_zero(ds, c);
    for (int64_t y = 0; y < kH; ++y)
      for (int64_t x = 0; x < kW; ++x) {
        const int64_t sy = y + dy, sx = (flip ? kW - 1 - x : x) + dx;
        const bool in = 0 <= sy && sy < kH && 0 <= sx && sx < kW;
        out[(c * kH + y) * kW + x] = in ? p[(c * kH + sy) * kW + sx] : zero;
      }
  }
  return out;
}

TEST(ParseAugment, Forms) {
  struct Case {
    const char* spec;
    int pad;
    bool flip;
    const char* str;
  };
  for (const Case& c : {Case{"none", -1, false, "none"}, Case{"flip", -1, true, "flip"}, Case{"crop", 4, false, "crop:4"},
                        Case{"crop:0", 0, false, "crop:0"}, Case{"crop:12", 12, false, "crop:12"},
                        Case{"crop:2,flip", 2, true, "crop:2,flip"}, Case{"flip,crop:3", 3, true, "crop:3,flip"},
                        Case{"crop,flip", 4, true, "crop:4,flip"}, Case{"flip,crop", 4, true, "crop:4,flip"}}) {
    const Augment a = parse_augment(c.spec);
    EXPECT_EQ(a.crop_padding, c.pad) << c.spec;
    EXPECT_EQ(a.hflip, c.flip) << c.spec;
    EXPECT_EQ(a.str(), c.str) << c.spec;
    EXPECT_EQ(a.any(), c.pad >= 0 || c.flip) << c.spec;
    const Augment b = parse_augment(a.str());  // str() reads back
    EXPECT_EQ(b.crop_padding, a.crop_padding);
    EXPECT_EQ(b.hflip, a.hflip);
  }
  EXPECT_FALSE(Augment{}.any());
  EXPECT_EQ(Augment{}.str(), "none");
}

TEST(ParseAugment, BadSpecs) {
  for (const char* spec : {"", "rotate", "flip,flip", "crop,crop:2", "none,flip", "flip,", ",flip", "crop:4,", "Flip",
                           "crop;4", "flip crop"})
    expect_user_error([&] { parse_augment(spec); }, {"bad augmentation '" + std::string(spec) + "'", "crop:P"});
  for (const char* spec : {"crop:", "crop:-1", "crop:x", "crop:4x", "crop:2000", "crop: 4", "crop:99999999999"})
    expect_user_error([&] { parse_augment(spec); }, {"bad augmentation '" + std::string(spec) + "'", "0..1024"});
  // In-memory sets refuse the image-file transforms.
  expect_user_error([] { random_image_dataset(4, kC, kH, kW, 1).check(parse_augment("random-resized-crop:8")); },
                    {"random-resized-crop, resize, center-crop and jpeg-draft", "imagefolder:DIR"});
}

TEST(ParseAugment, ImageFileTransforms) {
  const Augment a = parse_augment("random-resized-crop:224,flip");
  EXPECT_EQ(a.resized_crop, 224);
  EXPECT_EQ(a.scale_min, 0.08);
  EXPECT_EQ(a.scale_max, 1.0);
  EXPECT_TRUE(a.hflip && a.for_files() && a.any());
  EXPECT_EQ(a.str(), "random-resized-crop:224,flip");
  const Augment b = parse_augment("flip,random-resized-crop:64:0.25:0.75");
  EXPECT_EQ(b.resized_crop, 64);
  EXPECT_EQ(b.scale_min, 0.25);
  EXPECT_EQ(b.scale_max, 0.75);
  EXPECT_EQ(b.str(), "random-resized-crop:64:0.25:0.75,flip");
  EXPECT_EQ(parse_augment(b.str()).str(), b.str());
  const Augment c = parse_augment("resize:256,center-crop:224");
  EXPECT_EQ(c.resize, 256);
  EXPECT_EQ(c.center_crop, 224);
  EXPECT_EQ(c.str(), "resize:256,center-crop:224");
  // torchvision's Compose([CenterCrop(224), Resize(256)]) would be another pipeline: refused, not reordered.
  expect_user_error([] { parse_augment("center-crop:224,resize:256"); }, {"resize goes before center-crop"});
  EXPECT_FALSE(parse_augment("crop:4,flip").for_files());
  for (const char* spec : {"random-resized-crop:0", "random-resized-crop:x", "resize:0", "center-crop:-3",
                           "random-resized-crop:20000"})
    expect_user_error([&] { parse_augment(spec); }, {"bad augmentation '" + std::string(spec) + "'", "whole number"});
  expect_user_error([] { parse_augment("random-resized-crop:224:0.5"); }, {"random-resized-crop:S:SMIN:SMAX"});
  expect_user_error([] { parse_augment("random-resized-crop:224:0.9:0.5"); }, {"SMIN is above its SMAX"});
  expect_user_error([] { parse_augment("random-resized-crop:224:0:0.5"); }, {"(0, 1]"});
  expect_user_error([] { parse_augment("random-resized-crop:224,resize:256"); }, {"goes with flip alone"});
  expect_user_error([] { parse_augment("random-resized-crop:224,crop:4"); }, {"goes with flip alone"});
  expect_user_error([] { parse_augment("resize:256,crop:4"); }, {"crop:P is for in-memory image sets"});
  expect_user_error([] { parse_augment("resize:256,resize:128"); }, {"resize appears twice"});
  // jpeg-draft changes how the resized images are decoded: it goes with a resize.
  const Augment d = parse_augment("jpeg-draft,random-resized-crop:64,flip");
  EXPECT_TRUE(d.jpeg_draft && d.for_files());
  EXPECT_EQ(d.str(), "random-resized-crop:64,flip,jpeg-draft");
  EXPECT_EQ(parse_augment("resize:32,center-crop:32,jpeg-draft").str(), "resize:32,center-crop:32,jpeg-draft");
  EXPECT_FALSE(parse_augment("random-resized-crop:64").jpeg_draft);
  for (const char* spec : {"jpeg-draft", "center-crop:32,jpeg-draft", "flip,jpeg-draft"})
    expect_user_error([&] { parse_augment(spec); }, {"jpeg-draft decodes JPEGs smaller", "random-resized-crop or resize"});
  expect_user_error([] { parse_augment("resize:64,jpeg-draft,jpeg-draft"); }, {"jpeg-draft appears twice"});
}

TEST(LoadSample, NormalizedMatchesFormula) {
  const ImageDataset ds = random_image_dataset(30, kC, kH, kW, 1);
  EXPECT_EQ(ds.sample_shape(), (Shape{kC, kH, kW}));
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto out = plain(ds, i);
    for (int64_t k = 0; k < kPer; ++k) {
      const int64_t c = k / (kH * kW);
      ASSERT_NEAR(out[k], (ds.images.data<uint8_t>()[i * kPer + k] / 255.0f - ds.mean[c]) / ds.std[c], 1e-5)
          << i << ", " << k;
    }
  }
}

TEST(LoadSample, NoAugmentationAndZeroPaddingCropAreNormalized) {
  const ImageDataset ds = random_image_dataset(40, kC, kH, kW, 2);
  Augment crop0;
  crop0.crop_padding = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto p = plain(ds, i);
    EXPECT_TRUE(same_floats(sample(ds, i, Augment{}, 1, 0).data(), p.data(), kPer)) << i;
    for (int64_t epoch : {0, 3})
      EXPECT_TRUE(same_floats(sample(ds, i, crop0, 7, epoch).data(), p.data(), kPer)) << i;
  }
}

TEST(LoadSample, FlipMirrorsExactlyAboutHalfTheTime) {
  const ImageDataset ds = random_image_dataset(2000, kC, kH, kW, 3);
  Augment flip;
  flip.hflip = true;
  int flipped = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto out = sample(ds, i, flip, 5, 1);
    const bool same = same_floats(out.data(), plain(ds, i).data(), kPer);
    const bool mirror = same_floats(out.data(), moved(ds, i, true, 0, 0).data(), kPer);
    ASSERT_NE(same, mirror) << "sample " << i << " is neither itself nor its exact mirror";
    flipped += mirror;
  }
  // p = 0.5 over 2000 draws: 1000 +- 22 (1 sigma); deterministic (fixed seed), bounds 4.5 sigma.
  EXPECT_GT(flipped, 900);
  EXPECT_LT(flipped, 1100);
}

TEST(LoadSample, CropShiftsContentAndPadsWithNormalizedZero) {
  const ImageDataset ds = random_image_dataset(1500, kC, kH, kW, 4);
  for (bool with_flip : {false, true}) {
    Augment a;
    a.crop_padding = 3;
    a.hflip = with_flip;
    std::set<int64_t> dys, dxs;
    int flipped = 0, unshifted = 0;
    for (int64_t i = 0; i < ds.size(); ++i) {
      const auto out = sample(ds, i, a, 11, 2);
      int matches = 0;
      for (bool f : {false, true}) {
        if (f && !with_flip) continue;
        for (int64_t dy = -3; dy <= 3; ++dy)
          for (int64_t dx = -3; dx <= 3; ++dx)
            if (same_floats(out.data(), moved(ds, i, f, dy, dx).data(), kPer)) {
              ++matches;
              dys.insert(dy);
              dxs.insert(dx);
              flipped += f;
              unshifted += dy == 0 && dx == 0;
            }
      }
      ASSERT_EQ(matches, 1) << "sample " << i << ": not one shift (and flip) of the padded image";
    }
    // Every offset in [-P, P] occurs on both axes (each has p = 1/7 per sample).
    EXPECT_EQ(dys.size(), 7u);
    EXPECT_EQ(dxs.size(), 7u);
    EXPECT_GT(unshifted, 0);
    EXPECT_LT(unshifted, 100);  // p = 1/49: about 31
    if (with_flip) {
      EXPECT_GT(flipped, 650);  // p = 0.5 over 1500: 750 +- 19
      EXPECT_LT(flipped, 850);
    }
  }
}

TEST(LoadSample, PaddingLargerThanTheImageGivesAllPadding) {
  const ImageDataset ds = random_image_dataset(300, kC, kH, kW, 5);
  Augment a;
  a.crop_padding = 20;
  int all_padding = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto out = sample(ds, i, a, 1, 0);
    bool only_zero = true;
    for (int64_t k = 0; k < kPer; ++k) only_zero = only_zero && out[k] == normalized_zero(ds, k / (kH * kW));
    all_padding += only_zero;
  }
  EXPECT_GT(all_padding, 0);  // most windows miss the 5 x 7 image entirely
}

TEST(LoadSample, DrawsArePureFunctionsOfSeedEpochIndex) {
  const ImageDataset ds = random_image_dataset(64, kC, kH, kW, 6);
  const Augment a = parse_augment("crop:2,flip");
  std::vector<std::vector<float>> ref;
  for (int64_t i = 0; i < ds.size(); ++i) ref.push_back(sample(ds, i, a, 9, 4));
  // Reverse order, interleaved with other (seed, epoch) calls, and from other threads: the same bytes.
  for (int64_t i = ds.size() - 1; i >= 0; --i) {
    sample(ds, (i * 7) % ds.size(), a, 10, 5);
    EXPECT_TRUE(same_floats(sample(ds, i, a, 9, 4).data(), ref[i].data(), kPer)) << i;
  }
  std::vector<std::vector<float>> threaded(ds.size());
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int64_t i = t; i < ds.size(); i += 4) threaded[i] = sample(ds, i, a, 9, 4);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(threaded, ref);
  // Another epoch or seed draws differently for some samples.
  int epoch_diff = 0, seed_diff = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    epoch_diff += sample(ds, i, a, 9, 5) != ref[i];
    seed_diff += sample(ds, i, a, 8, 4) != ref[i];
  }
  EXPECT_GT(epoch_diff, 32);
  EXPECT_GT(seed_diff, 32);
}

TEST(LoadSample, RejectsAnIndexOutsideTheDataset) {
  const ImageDataset ds = random_image_dataset(5, kC, kH, kW, 7);
  std::vector<float> out(kPer);
  for (const Augment& a : {Augment{}, parse_augment("crop:1,flip")}) {
    expect_user_error([&] { load_sample(ds, 5, a, 0, 0, out.data()); },
                      {"sample index 5 is out of range for dataset 'random' with 5 samples"});
    expect_user_error([&] { load_sample(ds, -1, a, 0, 0, out.data()); }, {"sample index -1 is out of range"});
  }
  // Fewer labels than images: the labels bound the index too.
  ImageDataset short_labels = ds;
  short_labels.labels = ds.labels.slice(0, 3);
  expect_user_error([&] { load_sample(short_labels, 3, Augment{}, 0, 0, out.data()); }, {"with 3 samples"});
}

}  // namespace
}  // namespace fanout::data
