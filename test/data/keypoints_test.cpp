// Keypoint volumes: load_keypoints3d on small .npy volumes and landmark files
// written here (JSON and CSV, several dtypes, C = 1 and 2), bit-exact tensors,
// statistics against float64, sorted order, every bad input as a one-line
// error naming the file; make_synthetic3d's contract; and the DataLoader's
// dense (heatmap) targets.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <limits>
#include <locale>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "data/pipeline_test_util.h"
#include "runtime/core/error.h"
#include "runtime/data/dataset.h"
#include "runtime/data/keypoints.h"
#include "runtime/data/loader.h"
#include "runtime/data/sampler.h"
#include "runtime/io/npy.h"
#include "support/test_util.h"

namespace fanout::data {
namespace {

namespace fs = std::filesystem;
using fanout::testing::expect_user_error;
using fanout::testing::same_bits;
using fanout::testing::ScratchDir;
using ::testing::HasSubstr;

// One volume as written: its name, the tensor saved (any dtype) and its K landmarks (z, y, x) in double.
struct Vol {
  std::string name;
  Tensor data;
  std::vector<double> lm;  // K * 3
};

// Seeded random values of dtype t, never all zero.
Tensor random_volume(const Shape& s, DType t, std::mt19937_64& rng) {
  Tensor x = Tensor::empty(s, t);
  std::uniform_real_distribution<double> u(-50.0, 50.0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    switch (t) {
      case DType::U8: x.data<uint8_t>()[i] = static_cast<uint8_t>(rng() >> 56); break;
      case DType::I32: x.data<int32_t>()[i] = static_cast<int32_t>(rng() % 200001) - 100000; break;
      case DType::I64: x.data<int64_t>()[i] = static_cast<int64_t>(rng() % 2000001) - 1000000; break;
      case DType::F32: x.data<float>()[i] = static_cast<float>(u(rng)); break;
      case DType::F64: x.data<double>()[i] = u(rng); break;
    }
  }
  // Never all zeros.
  if (t == DType::U8 && x.numel() > 0) x.data<uint8_t>()[0] = 200;
  return x;
}

// Element i of t as float32 (what the loader must store).
float as_float(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::U8: return static_cast<float>(t.data<uint8_t>()[i]);
    case DType::I32: return static_cast<float>(t.data<int32_t>()[i]);
    case DType::I64: return static_cast<float>(t.data<int64_t>()[i]);
    case DType::F32: return t.data<float>()[i];
    case DType::F64: return static_cast<float>(t.data<double>()[i]);
  }
  return 0;
}

std::vector<double> random_landmarks(int64_t k, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-2.0, 9.0);
  std::vector<double> lm(static_cast<size_t>(k * 3));
  for (double& v : lm) v = u(rng);
  return lm;
}

std::string num(double v) {
  std::ostringstream os;
  os.imbue(std::locale::classic());
  os << std::setprecision(17) << v;
  return os.str();
}

void write_text(const std::string& path, const std::string& text) {
  fanout::testing::write_file(path, fanout::testing::Bytes(text.begin(), text.end()));
}

std::string json_text(const std::vector<Vol>& vols) {
  std::string s = "{\n";
  for (size_t v = 0; v < vols.size(); ++v) {
    s += "  \"" + vols[v].name + "\": [";
    for (size_t i = 0; i < vols[v].lm.size(); i += 3)
      s += std::string(i ? ", " : "") + "[" + num(vols[v].lm[i]) + ", " + num(vols[v].lm[i + 1]) + ", " +
           num(vols[v].lm[i + 2]) + "]";
    s += v + 1 < vols.size() ? "],\n" : "]\n";
  }
  return s + "}\n";
}

// Rows in reverse order (the reader must not depend on it), "\r\n" line ends when crlf.
std::string csv_text(const std::vector<Vol>& vols, bool crlf = false) {
  const std::string nl = crlf ? "\r\n" : "\n";
  std::string s = "name,landmark,z,y,x" + nl;
  for (size_t v = vols.size(); v-- > 0;)
    for (size_t i = vols[v].lm.size() / 3; i-- > 0;)
      s += vols[v].name + "," + std::to_string(i) + "," + num(vols[v].lm[3 * i]) + "," + num(vols[v].lm[3 * i + 1]) +
           "," + num(vols[v].lm[3 * i + 2]) + nl;
  return s;
}

enum class Format { Json, Csv, CsvCrlf };

// DIR/SPLIT/NAME.npy for every volume, and the landmark file.
void write_split(const fs::path& dir, const std::vector<Vol>& vols, Format f) {
  fs::create_directories(dir);
  for (const Vol& v : vols) io::save_npy((dir / (v.name + ".npy")).string(), v.data);
  if (f == Format::Json) write_text((dir / "landmarks.json").string(), json_text(vols));
  else write_text((dir / "landmarks.csv").string(), csv_text(vols, f == Format::CsvCrlf));
}

std::vector<Vol> make_vols(const std::vector<std::string>& names, const Shape& s, DType t, int64_t k,
                           std::mt19937_64& rng) {
  std::vector<Vol> out;
  for (const std::string& n : names) out.push_back({n, random_volume(s, t, rng), random_landmarks(k, rng)});
  return out;
}

// Checks ds against vols (sorted by name here): images bit-exact as float32 (N, C, D, H, W), landmarks as float32.
void expect_loaded(const ImageDataset& ds, std::vector<Vol> vols, int64_t c, const std::string& name, int64_t k,
                   const HeatmapSpec& spec) {
  std::sort(vols.begin(), vols.end(), [](const Vol& a, const Vol& b) { return a.name < b.name; });
  const int64_t n = static_cast<int64_t>(vols.size());
  const Tensor& v0 = vols[0].data;
  const Shape want{n, c, v0.size(v0.dim() - 3), v0.size(v0.dim() - 2), v0.size(v0.dim() - 1)};
  EXPECT_EQ(ds.name, name);
  ASSERT_EQ(ds.images.shape(), want);
  ASSERT_EQ(ds.images.dtype(), DType::F32);
  ASSERT_EQ(ds.landmarks.shape(), (Shape{n, k, 3}));
  ASSERT_EQ(ds.landmarks.dtype(), DType::F32);
  EXPECT_FALSE(ds.labels.defined());
  EXPECT_TRUE(ds.dense_targets());
  EXPECT_EQ(ds.num_classes, k);
  EXPECT_EQ(ds.heatmap.radius, spec.radius);
  EXPECT_EQ(ds.heatmap.sigma, spec.sigma);
  EXPECT_EQ(ds.size(), n);
  EXPECT_EQ(ds.target_shape(), (Shape{k, want[2], want[3], want[4]}));
  const int64_t per = want.numel() / n;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(vols[i].data.numel(), per);
    for (int64_t e = 0; e < per; ++e) {
      const float got = ds.images.f32()[i * per + e], exp = as_float(vols[i].data, e);
      ASSERT_EQ(std::memcmp(&got, &exp, sizeof(float)), 0) << "volume " << vols[i].name << " element " << e;
    }
    for (int64_t j = 0; j < k * 3; ++j) {
      const float got = ds.landmarks.f32()[i * k * 3 + j], exp = static_cast<float>(vols[i].lm[j]);
      ASSERT_EQ(std::memcmp(&got, &exp, sizeof(float)), 0) << "volume " << vols[i].name << " coordinate " << j;
    }
  }
}

// Per-channel mean and population std in float64 of the volumes (as float32), and the loader's result against it.
void expect_stats(const std::vector<float>& mean, const std::vector<float>& std, const std::vector<Vol>& vols,
                  int64_t c) {
  ASSERT_EQ(static_cast<int64_t>(mean.size()), c);
  ASSERT_EQ(static_cast<int64_t>(std.size()), c);
  for (int64_t ch = 0; ch < c; ++ch) {
    std::vector<double> xs;
    for (const Vol& v : vols) {
      const int64_t plane = v.data.numel() / c;
      for (int64_t e = 0; e < plane; ++e) xs.push_back(as_float(v.data, ch * plane + e));
    }
    double s = 0;
    for (double x : xs) s += x;
    const double m = s / static_cast<double>(xs.size());
    double s2 = 0;
    for (double x : xs) s2 += (x - m) * (x - m);
    const double sd = std::sqrt(s2 / static_cast<double>(xs.size()));
    EXPECT_NEAR(mean[ch], m, 1e-6 * std::max(1.0, std::abs(m))) << "channel " << ch;
    if (sd == 0) EXPECT_EQ(std[ch], 1.0f) << "channel " << ch;
    else EXPECT_NEAR(std[ch], sd, 1e-6 * sd) << "channel " << ch;
  }
}

// ---------------------------------------------------------------------------
// Reading

TEST(KeypointLoad, JsonUint8OneChannel) {
  ScratchDir dir;
  std::mt19937_64 rng(1);
  // Written out of order; C = 1 from (D, H, W) files.
  const auto train = make_vols({"vol_b", "vol_a", "Vol_c", "vol_10", "vol_9"}, Shape{3, 4, 5}, DType::U8, 3, rng);
  const auto test = make_vols({"t2", "t1"}, Shape{3, 4, 5}, DType::U8, 3, rng);
  write_split(dir.path() / "train", train, Format::Json);
  write_split(dir.path() / "test", test, Format::Json);
  const HeatmapSpec spec{3, 1.25};
  const TrainTest tt = load_keypoints3d(dir.path().string(), spec);
  expect_loaded(tt.train, train, 1, "keypoints3d/train", 3, spec);
  expect_loaded(tt.test, test, 1, "keypoints3d/test", 3, spec);
  expect_stats(tt.train.mean, tt.train.std, train, 1);
  EXPECT_EQ(tt.test.mean, tt.train.mean);
  EXPECT_EQ(tt.test.std, tt.train.std);
}

TEST(KeypointLoad, SortedByName) {
  ScratchDir dir;
  std::mt19937_64 rng(2);
  const auto train = make_vols({"b", "B", "a10", "a9", "a", "_x"}, Shape{2, 2, 2}, DType::F32, 1, rng);
  write_split(dir.path() / "train", train, Format::Csv);
  write_split(dir.path() / "test", make_vols({"z"}, Shape{2, 2, 2}, DType::F32, 1, rng), Format::Csv);
  const TrainTest tt = load_keypoints3d(dir.path().string(), {});
  // Byte order of the names: "B" < "_x" < "a" < "a10" < "a9" < "b".
  const std::vector<std::string> order = {"B", "_x", "a", "a10", "a9", "b"};
  ASSERT_EQ(tt.train.size(), 6);
  for (int64_t i = 0; i < 6; ++i) {
    const Vol& v = *std::find_if(train.begin(), train.end(), [&](const Vol& x) { return x.name == order[i]; });
    EXPECT_EQ(tt.train.images.f32()[i * 8], v.data.data<float>()[0]) << order[i];
    EXPECT_EQ(tt.train.landmarks.f32()[i * 3], static_cast<float>(v.lm[0])) << order[i];
  }
}

TEST(KeypointLoad, CsvFloat64TwoChannels) {
  ScratchDir dir;
  std::mt19937_64 rng(3);
  const auto train = make_vols({"p3", "p1", "p2"}, Shape{2, 3, 4, 5}, DType::F64, 4, rng);
  const auto test = make_vols({"q1", "q2"}, Shape{2, 3, 4, 5}, DType::F64, 4, rng);
  write_split(dir.path() / "train", train, Format::Csv);
  write_split(dir.path() / "test", test, Format::CsvCrlf);
  const TrainTest tt = load_keypoints3d(dir.path().string(), {});
  expect_loaded(tt.train, train, 2, "keypoints3d/train", 4, {});
  expect_loaded(tt.test, test, 2, "keypoints3d/test", 4, {});
  expect_stats(tt.train.mean, tt.train.std, train, 2);
  EXPECT_EQ(tt.test.mean, tt.train.mean);
  EXPECT_EQ(tt.test.std, tt.train.std);
}

TEST(KeypointLoad, Int32AndInt64AndFloat32Volumes) {
  for (DType t : {DType::I32, DType::I64, DType::F32}) {
    SCOPED_TRACE(dtype_name(t));
    ScratchDir dir;
    std::mt19937_64 rng(4);
    const auto train = make_vols({"a", "b", "c", "d"}, Shape{1, 5, 3, 2}, t, 2, rng);
    const auto test = make_vols({"e"}, Shape{1, 5, 3, 2}, t, 2, rng);
    write_split(dir.path() / "train", train, Format::Json);
    write_split(dir.path() / "test", test, Format::Csv);
    const TrainTest tt = load_keypoints3d(dir.path().string(), {});
    expect_loaded(tt.train, train, 1, "keypoints3d/train", 2, {});
    expect_loaded(tt.test, test, 1, "keypoints3d/test", 2, {});
    expect_stats(tt.train.mean, tt.train.std, train, 1);
  }
}

TEST(KeypointLoad, ConstantChannelHasStdOne) {
  ScratchDir dir;
  std::mt19937_64 rng(5);
  auto train = make_vols({"a", "b"}, Shape{2, 2, 3, 3}, DType::F32, 2, rng);
  for (Vol& v : train)
    for (int64_t e = 18; e < 36; ++e) v.data.data<float>()[e] = 7.5f;  // channel 1
  write_split(dir.path() / "train", train, Format::Json);
  write_split(dir.path() / "test", make_vols({"c"}, Shape{2, 2, 3, 3}, DType::F32, 2, rng), Format::Json);
  const TrainTest tt = load_keypoints3d(dir.path().string(), {});
  expect_stats(tt.train.mean, tt.train.std, train, 2);
  EXPECT_EQ(tt.train.mean[1], 7.5f);
  EXPECT_EQ(tt.train.std[1], 1.0f);
  EXPECT_NE(tt.train.std[0], 1.0f);
}

TEST(KeypointLoad, IgnoresFilesThatAreNotVolumes) {
  ScratchDir dir;
  std::mt19937_64 rng(6);
  const auto train = make_vols({"a", "b"}, Shape{2, 3, 2}, DType::U8, 1, rng);
  write_split(dir.path() / "train", train, Format::Json);
  write_split(dir.path() / "test", make_vols({"c"}, Shape{2, 3, 2}, DType::U8, 1, rng), Format::Json);
  write_text(dir / "train/README.txt", "notes");
  write_text(dir / "train/a.npz", "not read");
  fs::create_directories(dir.path() / "train/extra");
  const TrainTest tt = load_keypoints3d(dir.path().string(), {});
  expect_loaded(tt.train, train, 1, "keypoints3d/train", 1, {});
}

TEST(KeypointLoad, JsonIntegerAndNegativeCoordinates) {
  ScratchDir dir;
  std::mt19937_64 rng(7);
  auto train = make_vols({"a"}, Shape{2, 3, 2}, DType::U8, 2, rng);
  write_split(dir.path() / "train", train, Format::Json);
  write_text(dir / "train/landmarks.json", R"({"a": [[1, -2, 3], [0.5, 1e-3, -0.0]]})");
  write_split(dir.path() / "test", make_vols({"c"}, Shape{2, 3, 2}, DType::U8, 2, rng), Format::Json);
  const TrainTest tt = load_keypoints3d(dir.path().string(), {});
  const std::vector<float> want = {1, -2, 3, 0.5f, 1e-3f, -0.0f};
  ASSERT_EQ(tt.train.landmarks.numel(), 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(tt.train.landmarks.f32()[i], want[i]) << i;
  EXPECT_TRUE(std::signbit(tt.train.landmarks.f32()[5]));
}

// Outside the volume means a voxel outside it: each coordinate rounded as the heatmap rounds it
// (floor(c + 0.5)), so -0.4 and 3.4 in 4 voxels are inside and 3.5 is not.
TEST(KeypointLoad, OutsideTheVolumeIsTheRoundedVoxelOutside) {
  for (const auto& [json, outside] : {std::pair{R"({"a": [[3.4, -0.4, 0], [1, 1, 1]]})", false},
                                      std::pair{R"({"a": [[3.5, 0, 0], [1, 1, 1]]})", true},
                                      std::pair{R"({"a": [[0, -0.5, 0], [1, 1, 1]]})", false},
                                      std::pair{R"({"a": [[0, -0.51, 0], [1, 1, 1]]})", true}}) {
    SCOPED_TRACE(json);
    ScratchDir dir;
    std::mt19937_64 rng(7);
    write_split(dir.path() / "train", make_vols({"a"}, Shape{4, 4, 4}, DType::U8, 2, rng), Format::Json);
    write_text(dir / "train/landmarks.json", json);
    write_split(dir.path() / "test", make_vols({"c"}, Shape{4, 4, 4}, DType::U8, 2, rng), Format::Json);
    write_text(dir / "test/landmarks.json", R"({"c": [[1, 2, 3], [0, 0, 0]]})");
    const TrainTest tt = load_keypoints3d(dir.path().string(), {});
    ASSERT_EQ(tt.warnings.size(), outside ? 1u : 0u) << (tt.warnings.empty() ? "" : tt.warnings[0]);
    if (outside) EXPECT_NE(tt.warnings[0].find("1 landmark of 1 volume lies outside the volume"), std::string::npos);
  }
}

TEST(KeypointLoad, ThroughOpenDataset) {
  ScratchDir dir;
  std::mt19937_64 rng(8);
  const auto train = make_vols({"a", "b", "c"}, Shape{2, 4, 3, 3}, DType::F64, 2, rng);
  const auto test = make_vols({"d", "e"}, Shape{2, 4, 3, 3}, DType::F64, 2, rng);
  write_split(dir.path() / "train", train, Format::Json);
  write_split(dir.path() / "test", test, Format::Csv);
  const HeatmapSpec spec{1, 0.75};
  const TrainTest tt = open_dataset("keypoints3d:" + dir.path().string(), 0, spec);
  expect_loaded(tt.train, train, 2, "keypoints3d/train", 2, spec);
  expect_loaded(tt.test, test, 2, "keypoints3d/test", 2, spec);
  expect_stats(tt.train.mean, tt.train.std, train, 2);
  const TrainTest direct = load_keypoints3d(dir.path().string(), spec);
  EXPECT_TRUE(same_bits(tt.train.images, direct.train.images));
  EXPECT_TRUE(same_bits(tt.test.landmarks, direct.test.landmarks));

  expect_user_error([] { open_dataset("keypoints3d", 0, {}); }, {"keypoints3d", "directory"});
  expect_user_error([] { open_dataset("keypoints3d:", 0, {}); }, {"keypoints3d", "directory"});
}

// ---------------------------------------------------------------------------
// Errors: each a one-line fanout::Error naming the file.

// A valid data set: train a, b, c (3, 4, 5) uint8 with K = 3 in JSON; test d, e in CSV.
struct ValidSet {
  ScratchDir dir;
  std::vector<Vol> train, test;
  ValidSet() {
    std::mt19937_64 rng(42);
    train = make_vols({"a", "b", "c"}, Shape{3, 4, 5}, DType::U8, 3, rng);
    test = make_vols({"d", "e"}, Shape{3, 4, 5}, DType::U8, 3, rng);
    write_split(dir.path() / "train", train, Format::Json);
    write_split(dir.path() / "test", test, Format::Csv);
  }
  std::string root() const { return dir.path().string(); }
  std::string operator/(const std::string& rel) const { return dir / rel; }
};


// Loads the valid set after `mutate`, which returns what the one-line error must contain.
void expect_load_error(const std::function<std::vector<std::string>(ValidSet&)>& mutate) {
  ValidSet s;
  ASSERT_NO_THROW(load_keypoints3d(s.root(), {})) << "the valid set must load";
  std::vector<std::string> parts = mutate(s);
  parts.push_back("keypoints3d");
  const std::string msg = expect_user_error([&] { load_keypoints3d(s.root(), {}); }, parts);
  EXPECT_THAT(msg, HasSubstr(parts[0]));
}

void save(const std::string& path, const Shape& shape, DType t = DType::U8) {
  std::mt19937_64 rng(9);
  io::save_npy(path, random_volume(shape, t, rng));
}

TEST(KeypointErrors, MissingDirectories) {
  ScratchDir dir;
  expect_user_error([&] { load_keypoints3d(dir / "nope", {}); }, {dir / "nope", "not a directory", "does not exist"});
  write_text(dir / "file", "x");
  expect_user_error([&] { load_keypoints3d(dir / "file", {}); }, {dir / "file", "not a directory"});
  expect_user_error([&] { load_keypoints3d("", {}); }, {"keypoints3d", "directory"});
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    fs::remove_all(s / "train");
    return {s / "train", "not a directory", "does not exist"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    fs::remove_all(s / "test");
    return {s / "test", "not a directory"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    fs::remove_all(s / "train");
    write_text(s / "train", "a file");
    return {s / "train", "not a directory"};
  });
}

TEST(KeypointErrors, VolumesAndLandmarkFiles) {
  // No volumes.
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    for (const char* n : {"a", "b", "c"}) fs::remove(s / ("train/" + std::string(n) + ".npy"));
    return {s / "train", "no .npy volumes"};
  });
  // Both landmark files, neither, and one that is a directory.
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    write_text(s / "train/landmarks.csv", csv_text(s.train));
    return {s / "train/landmarks.json", s / "train/landmarks.csv", "both"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    fs::remove(s / "test/landmarks.csv");
    return {s / "test", "no landmark file", "landmarks.json or landmarks.csv"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    fs::remove(s / "train/landmarks.json");
    fs::create_directories(s / "train/landmarks.json");
    return {s / "train/landmarks.json", "not a regular file"};
  });
  // A volume without landmarks (JSON and CSV).
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    save(s / "train/f.npy", Shape{3, 4, 5});
    return {s / "train/f.npy", "no landmarks", s / "train/landmarks.json"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    save(s / "test/aa.npy", Shape{3, 4, 5});
    return {s / "test/aa.npy", "no landmarks", s / "test/landmarks.csv"};
  });
  // Landmarks naming a missing volume (JSON and CSV).
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    fs::remove(s / "train/c.npy");
    return {s / "train/landmarks.json", "volume 'c'", s / "train", "no 'c.npy'"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    fs::remove(s / "test/d.npy");
    return {s / "test/landmarks.csv", "volume 'd'", s / "test", "no 'd.npy'"};
  });
}

// JSON for the valid set's training volumes a, b, c with `b` replaced.
std::string json_with_b(const std::string& b) {
  return R"({"a": [[1, 2, 3], [2, 3, 4], [0, 0, 0]], "b": )" + b + R"(, "c": [[1, 1, 1], [2, 2, 2], [3, 3, 3]]})";
}

TEST(KeypointErrors, MalformedJson) {
  struct Case {
    std::string text;
    std::vector<std::string> parts;
  };
  std::string many = "[";
  for (int i = 0; i < 4097; ++i) many += std::string(i ? "," : "") + "[1,2,3]";
  many += "]";
  const std::vector<Case> cases = {
      {"", {"not valid JSON"}},
      {"{", {"not valid JSON"}},
      {R"({"a": [[1, 2, 3]],})", {"not valid JSON"}},
      {json_with_b("[[NaN, 1, 2], [1, 2, 3], [1, 2, 3]]"), {"not valid JSON"}},
      {"[[1, 2, 3]]", {"not a JSON object"}},
      {json_with_b("3"), {"'b'", "no list of [z, y, x] landmarks"}},
      {json_with_b(R"({"z": 1})"), {"'b'", "no list"}},
      {json_with_b("[[1, 2], [1, 2, 3], [1, 2, 3]]"), {"'b'", "landmark 0", "3 numbers"}},
      {json_with_b("[[1, 2, 3], [1, 2, 3, 4], [1, 2, 3]]"), {"'b'", "landmark 1", "3 numbers"}},
      {json_with_b("[[1, 2, 3], [1, 2, 3], 7]"), {"'b'", "landmark 2", "3 numbers"}},
      {json_with_b(R"([[1, "2", 3], [1, 2, 3], [1, 2, 3]])"), {"'b'", "landmark 0 y", "not a number"}},
      {json_with_b("[[1, 2, true], [1, 2, 3], [1, 2, 3]]"), {"'b'", "landmark 0 x", "not a number"}},
      {json_with_b("[[null, 2, 3], [1, 2, 3], [1, 2, 3]]"), {"'b'", "landmark 0 z", "not a number"}},
      {json_with_b("[[1, 2, 3], [1, 2, 3], [1, 2, 1e300]]"), {"'b'", "landmark 2 x", "not a finite float32"}},
      {json_with_b("[[1, 2, 3], [1, 2, 3], [1, 2, -1e39]]"), {"'b'", "not a finite float32"}},
      {json_with_b("[[1, 2, 3], [1, 2, 3], [1, 2, 1e400]]"), {}},
      {json_with_b("[]"), {"'b'", "K must be at least 1"}},
      {json_with_b("[[1, 2, 3], [1, 2, 3]]"), {"'b'", "2 landmarks", "'a' has 3"}},
      {json_with_b(many), {"'b'", "4097 landmarks", "4096"}},
      {R"({"a": [[1, 2, 3], [2, 3, 4], [0, 0, 0]], "b": [[1, 2, 3], [2, 3, 4], [0, 0, 0]],)"
       R"( "a": [[1, 2, 3], [2, 3, 4], [0, 0, 0]], "c": [[1, 1, 1], [2, 2, 2], [3, 3, 3]]})",
       {"'a'", "twice"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text.substr(0, 120));
    expect_load_error([&](ValidSet& s) {
      write_text(s / "train/landmarks.json", c.text);
      std::vector<std::string> parts = {s / "train/landmarks.json"};
      parts.insert(parts.end(), c.parts.begin(), c.parts.end());
      return parts;
    });
  }
  // A name with a newline is escaped: the message stays one line.
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    write_text(s / "train/landmarks.json", R"({"x\ny": [[1, 2, 3]], )" + json_with_b("[[1, 2, 3]]").substr(1));
    return {s / "train/landmarks.json", "volume 'x\\x0ay'", "no 'x\\x0ay.npy'"};
  });
  // The valid replacement loads (the cases above fail for their own reason).
  ValidSet s;
  write_text(s / "train/landmarks.json", json_with_b("[[1, 2, 3], [1, 2, 3], [1, 2, 3]]"));
  EXPECT_NO_THROW(load_keypoints3d(s.root(), {}));
}

// CSV for the valid set's test volumes d, e (K = 3) with extra text after the header and valid rows.
std::string csv_with(const std::string& rows, const std::string& header = "name,landmark,z,y,x") {
  return header + "\n" + rows;
}
const char* const kGoodRows = "d,0,1,2,3\nd,1,1,2,3\nd,2,1,2,3\ne,2,0,0,0\ne,1,0,0,0\ne,0,0,0,0\n";

TEST(KeypointErrors, MalformedCsv) {
  struct Case {
    std::string text;
    std::vector<std::string> parts;
  };
  const std::string good = kGoodRows;
  const std::vector<Case> cases = {
      {"", {"header", "name,landmark,z,y,x"}},
      {"\n" + good, {"header"}},
      {csv_with(good, "name,landmark,x,y,z"), {"header", "'name,landmark,x,y,z'"}},
      {csv_with(good, "name, landmark, z, y, x"), {"header"}},
      {csv_with(good, "\xef\xbb\xbfname,landmark,z,y,x"), {"header"}},
      {csv_with(good + "d,0,1,2\n"), {"line 8", "4 fields", "expected 5"}},
      {csv_with("e,0,1,2,3,4\n" + good), {"line 2", "6 fields"}},
      {csv_with("d,0,1,2,3\n\n" + good), {"line 3", "1 fields"}},
      {csv_with(",0,1,2,3\n" + good), {"line 2", "empty name"}},
      {csv_with("d,x,1,2,3\n" + good), {"line 2", "landmark index 'x'", "0..4095"}},
      {csv_with("d,1.5,1,2,3\n" + good), {"line 2", "landmark index '1.5'"}},
      {csv_with("d,-1,1,2,3\n" + good), {"line 2", "landmark index '-1'"}},
      {csv_with("d,,1,2,3\n" + good), {"line 2", "landmark index ''"}},
      {csv_with("d,4096,1,2,3\n" + good), {"line 2", "landmark index '4096'"}},
      {csv_with("d,3,abc,2,3\n" + good), {"line 2", "z 'abc'", "not a number"}},
      {csv_with("d,3,1,,3\n" + good), {"line 2", "y ''", "not a number"}},
      {csv_with("d,3,1,2, 3\n" + good), {"line 2", "x ' 3'", "not a number"}},
      {csv_with("d,3,1,2,3x\n" + good), {"line 2", "not a number"}},
      {csv_with("d,3,nan,2,3\n" + good), {"line 2", "z 'nan'", "not a finite float32"}},
      {csv_with("d,3,1,-inf,3\n" + good), {"line 2", "not a finite float32"}},
      {csv_with("d,3,1,2,1e39\n" + good), {"line 2", "x '1e39'", "not a finite float32"}},
      {csv_with(good + "d,1,5,5,5\n"), {"line 8", "landmark 1 of volume 'd'", "already given on line 3"}},
      {csv_with("d,0,1,2,3\nd,1,1,2,3\nd,3,1,2,3\ne,0,0,0,0\ne,1,0,0,0\ne,2,0,0,0\n"),
       {"'d'", "landmark 3 (line 4)", "no landmark 2"}},
      {csv_with(good + "e,3,0,0,0\n"), {"'e'", "4 landmarks", "'d' has 3"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text.substr(0, 120));
    expect_load_error([&](ValidSet& s) {
      write_text(s / "test/landmarks.csv", c.text);
      std::vector<std::string> parts = {s / "test/landmarks.csv"};
      parts.insert(parts.end(), c.parts.begin(), c.parts.end());
      return parts;
    });
  }
  // The rows the cases start from load, also with "\r\n" and no final newline.
  ValidSet s;
  write_text(s / "test/landmarks.csv", csv_with(kGoodRows));
  EXPECT_NO_THROW(load_keypoints3d(s.root(), {}));
  write_text(s / "test/landmarks.csv", "name,landmark,z,y,x\r\nd,0,1,2,3\r\nd,1,1,2,3\r\nd,2,1,2,3\r\n"
                                       "e,2,0,0,0\r\ne,1,0,0,0\r\ne,0,0,0,0");
  EXPECT_NO_THROW(load_keypoints3d(s.root(), {}));
}

TEST(KeypointErrors, ShapeAndLandmarkCountMismatches) {
  // Within a split: spatial size and channels.
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    save(s / "train/b.npy", Shape{3, 4, 6});
    return {s / "train/b.npy", "(1, 3, 4, 6)", s / "train/a.npy", "(1, 3, 4, 5)"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    save(s / "train/c.npy", Shape{2, 3, 4, 5}, DType::F32);
    return {s / "train/c.npy", "(2, 3, 4, 5)", s / "train/a.npy"};
  });
  // Train against test.
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    save(s / "test/d.npy", Shape{3, 5, 5});
    save(s / "test/e.npy", Shape{3, 5, 5});
    return {s / "test/d.npy", "(1, 3, 5, 5)", s / "train/a.npy", "(1, 3, 4, 5)"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    write_text(s / "test/landmarks.csv", csv_with("d,0,1,2,3\nd,1,1,2,3\ne,0,1,1,1\ne,1,1,1,1\n"));
    return {s / "test/landmarks.csv", "2 landmarks", s / "train/landmarks.json", "has 3"};
  });
  // Different dtypes of the same shape are fine.
  ValidSet s;
  save(s / "train/b.npy", Shape{3, 4, 5}, DType::F64);
  save(s / "test/e.npy", Shape{1, 3, 4, 5}, DType::I32);
  EXPECT_NO_THROW(load_keypoints3d(s.root(), {}));
}

TEST(KeypointErrors, BadVolumeFiles) {
  const std::vector<std::pair<Shape, std::string>> dims = {
      {Shape{4, 5}, "(4, 5)"}, {Shape{60}, "(60)"}, {Shape{1, 1, 3, 4, 5}, "(1, 1, 3, 4, 5)"}};
  for (const auto& [shape, str] : dims) {
    SCOPED_TRACE(str);
    expect_load_error([&](ValidSet& s) -> std::vector<std::string> {
      save(s / "train/b.npy", shape);
      return {s / "train/b.npy", str, "expected (D, H, W) or (C, D, H, W)"};
    });
  }
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    io::save_npy(s / "train/b.npy", Tensor::zeros(Shape{}, DType::F32));
    return {s / "train/b.npy", "expected (D, H, W) or (C, D, H, W)"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    save(s / "train/b.npy", Shape{0, 4, 5});
    return {s / "train/b.npy", "empty volume"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    std::mt19937_64 rng(1);
    Tensor v = random_volume(Shape{3, 4, 5}, DType::F32, rng);
    v.data<float>()[17] = std::numeric_limits<float>::quiet_NaN();
    io::save_npy(s / "test/e.npy", v);
    return {s / "test/e.npy", "voxel 17", "not a finite float32"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    std::mt19937_64 rng(1);
    Tensor v = random_volume(Shape{3, 4, 5}, DType::F64, rng);
    v.data<double>()[3] = 1e300;
    io::save_npy(s / "train/a.npy", v);
    return {s / "train/a.npy", "voxel 3", "not a finite float32"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    write_text(s / "train/b.npy", "this is not an npy file at all");
    return {s / "train/b.npy"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    fs::remove(s / "train/b.npy");
    fs::create_directories(s / "train/b.npy");
    return {s / "train/b.npy"};
  });
  expect_load_error([](ValidSet& s) -> std::vector<std::string> {
    save(s / "train/.npy", Shape{3, 4, 5});
    return {s / "train/.npy", "empty name"};
  });
}

// ---------------------------------------------------------------------------
// make_synthetic3d

TEST(Synthetic3d, ShapesNamesAndSplitSizes) {
  const HeatmapSpec spec{3, 1.5};
  for (int64_t n : {1, 12, 49, 50, 61}) {
    SCOPED_TRACE(n);
    const TrainTest tt = make_synthetic3d(n, 7, spec);
    const int64_t nt = std::max<int64_t>(n / 5, 10);
    EXPECT_EQ(tt.train.images.shape(), (Shape{n, 1, 32, 32, 32}));
    EXPECT_EQ(tt.test.images.shape(), (Shape{nt, 1, 32, 32, 32}));
    EXPECT_EQ(tt.train.images.dtype(), DType::U8);
    EXPECT_EQ(tt.test.images.dtype(), DType::U8);
    EXPECT_EQ(tt.train.landmarks.shape(), (Shape{n, 4, 3}));
    EXPECT_EQ(tt.test.landmarks.shape(), (Shape{nt, 4, 3}));
    EXPECT_EQ(tt.train.landmarks.dtype(), DType::F32);
    EXPECT_EQ(tt.train.name, "synthetic3d/train");
    EXPECT_EQ(tt.test.name, "synthetic3d/test");
    EXPECT_EQ(tt.train.num_classes, 4);
    EXPECT_EQ(tt.test.num_classes, 4);
    EXPECT_EQ(tt.train.heatmap.radius, 3);
    EXPECT_EQ(tt.train.heatmap.sigma, 1.5);
    EXPECT_EQ(tt.test.heatmap.radius, 3);
    EXPECT_EQ(tt.train.target_shape(), (Shape{4, 32, 32, 32}));
    EXPECT_EQ(tt.train.mean, tt.test.mean);
    EXPECT_EQ(tt.train.std, tt.test.std);
  }
  expect_user_error([] { make_synthetic3d(0, 1, {}); }, {"synthetic3d"});
}

TEST(Synthetic3d, StatisticsOfTheTrainingSplit) {
  const TrainTest tt = make_synthetic3d(6, 3, {});
  const uint8_t* p = tt.train.images.data<uint8_t>();
  const int64_t n = tt.train.images.numel();
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i] / 255.0;
  const double m = s / n;
  for (int64_t i = 0; i < n; ++i) s2 += (p[i] / 255.0 - m) * (p[i] / 255.0 - m);
  ASSERT_EQ(tt.train.mean.size(), 1u);
  EXPECT_NEAR(tt.train.mean[0], m, 1e-6);
  EXPECT_NEAR(tt.train.std[0], std::sqrt(s2 / n), 1e-6);
}

TEST(Synthetic3d, DeterministicPerSeed) {
  const TrainTest a = make_synthetic3d(5, 11, {}), b = make_synthetic3d(5, 11, {}), c = make_synthetic3d(5, 12, {});
  EXPECT_TRUE(fanout::testing::same_data(a.train, b.train));
  EXPECT_TRUE(fanout::testing::same_data(a.test, b.test));
  EXPECT_FALSE(same_bits(a.train.images, c.train.images));
  EXPECT_FALSE(same_bits(a.train.landmarks, c.train.landmarks));
  EXPECT_FALSE(same_bits(a.test.images, c.test.images));
  // Train and test are different streams.
  EXPECT_FALSE(same_bits(a.train.landmarks.slice(0, 5), a.test.landmarks.slice(0, 5)));
}

TEST(Synthetic3d, LandmarksInsideAndApart) {
  for (uint64_t seed : {0, 1, 2}) {
    const TrainTest tt = make_synthetic3d(100, seed, {});
    for (const ImageDataset* ds : {&tt.train, &tt.test}) {
      const float* lm = ds->landmarks.f32();
      for (int64_t i = 0; i < ds->size(); ++i) {
        for (int64_t k = 0; k < 4; ++k)
          for (int a = 0; a < 3; ++a) {
            const float v = lm[(i * 4 + k) * 3 + a];
            ASSERT_TRUE(v >= 4.0f && v <= 27.0f) << ds->name << " sample " << i << " landmark " << k << ": " << v;
          }
        for (int64_t k = 0; k < 4; ++k)
          for (int64_t j = 0; j < k; ++j) {
            double d2 = 0;
            for (int a = 0; a < 3; ++a) {
              const double d = lm[(i * 4 + k) * 3 + a] - lm[(i * 4 + j) * 3 + a];
              d2 += d * d;
            }
            ASSERT_GE(std::sqrt(d2), 9.0 - 1e-4) << ds->name << " sample " << i << " landmarks " << j << ", " << k;
          }
      }
    }
  }
}

// Blob 0 (small, bright): within 3.5 voxels of landmark 0 (other blobs are at
// least 9 away), the brightest voxel lies within 2 voxels of the landmark.
TEST(Synthetic3d, BrightestVoxelNearTheSmallBrightBlob) {
  for (uint64_t seed : {0, 5}) {
    const TrainTest tt = make_synthetic3d(60, seed, {});
    for (const ImageDataset* ds : {&tt.train, &tt.test}) {
      for (int64_t i = 0; i < ds->size(); ++i) {
        const uint8_t* v = ds->images.data<uint8_t>() + i * 32 * 32 * 32;
        const float* c = ds->landmarks.f32() + i * 4 * 3;  // landmark 0
        int best = -1;
        double best_d = 0;
        for (int z = 0; z < 32; ++z)
          for (int y = 0; y < 32; ++y)
            for (int x = 0; x < 32; ++x) {
              const double d = std::sqrt((z - c[0]) * (z - c[0]) + (y - c[1]) * (y - c[1]) + (x - c[2]) * (x - c[2]));
              if (d > 3.5) continue;
              const int val = v[(z * 32 + y) * 32 + x];
              if (val > best || (val == best && d < best_d)) best = val, best_d = d;
            }
        EXPECT_LE(best_d, 2.0) << ds->name << " sample " << i << " brightest " << best;
        // The blob stands out of the background (mean 30).
        EXPECT_GE(best, 120) << ds->name << " sample " << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// DataLoader with dense (heatmap) targets

struct DenseBatch {
  std::vector<float> x, y;
};

std::vector<DenseBatch> read_dense_epoch(const ImageDataset& ds, std::unique_ptr<Sampler> sampler, int workers,
                                         int64_t batch) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.prefetch = 2;
  DataLoader dl(ds, std::move(sampler), o);
  dl.start_epoch(0);
  const Shape ss = ds.sample_shape(), ts = ds.target_shape();
  std::vector<DenseBatch> out;
  Tensor x, y;
  while (dl.next(x, y)) {
    const int64_t b = x.size(0);
    EXPECT_EQ(x.shape(), (Shape{b, ss[0], ss[1], ss[2], ss[3]}));
    EXPECT_EQ(x.dtype(), DType::F32);
    EXPECT_EQ(y.shape(), (Shape{b, ts[0], ts[1], ts[2], ts[3]}));
    EXPECT_EQ(y.dtype(), DType::F32);
    out.push_back({std::vector<float>(x.f32(), x.f32() + x.numel()), std::vector<float>(y.f32(), y.f32() + y.numel())});
  }
  EXPECT_EQ(static_cast<int64_t>(out.size()), dl.num_batches());
  return out;
}

// Each batch row is the sample's normalization and render_heatmaps of its landmarks.
void expect_dense_batches(const ImageDataset& ds, const std::vector<int64_t>& order,
                          const std::vector<DenseBatch>& got) {
  const Shape ss = ds.sample_shape(), ts = ds.target_shape();
  const int64_t xn = ss.numel(), yn = ts.numel(), k = ds.landmarks.size(1);
  size_t pos = 0;
  for (const DenseBatch& b : got) {
    const int64_t rows = static_cast<int64_t>(b.y.size()) / yn;
    for (int64_t r = 0; r < rows; ++r, ++pos) {
      ASSERT_LT(pos, order.size());
      const int64_t i = order[pos];
      std::vector<float> want_x(static_cast<size_t>(xn));
      ds.normalized(i, want_x.data());
      EXPECT_EQ(std::memcmp(want_x.data(), b.x.data() + r * xn, xn * sizeof(float)), 0) << "x of sample " << i;
      Tensor heat = Tensor::empty(ts, DType::F32);
      const Tensor lm = ds.landmarks.slice(i, i + 1).view(Shape{k, 3});
      render_heatmaps(lm, ds.heatmap, heat);
      EXPECT_EQ(std::memcmp(heat.f32(), b.y.data() + r * yn, yn * sizeof(float)), 0) << "y of sample " << i;
      float peak = 0;
      for (int64_t e = 0; e < yn; ++e) peak = std::max(peak, b.y[r * yn + e]);
      EXPECT_GT(peak, 0.0f) << "sample " << i << " has an empty heatmap";
    }
  }
  EXPECT_EQ(pos, order.size());
}

bool same_epochs(const std::vector<DenseBatch>& a, const std::vector<DenseBatch>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].x.size() != b[i].x.size() || a[i].y.size() != b[i].y.size() ||
        std::memcmp(a[i].x.data(), b[i].x.data(), a[i].x.size() * sizeof(float)) != 0 ||
        std::memcmp(a[i].y.data(), b[i].y.data(), a[i].y.size() * sizeof(float)) != 0)
      return false;
  return true;
}

TEST(KeypointLoader, DenseTargetsOfSynthetic3d) {
  const TrainTest tt = make_synthetic3d(7, 4, HeatmapSpec{2, 0});
  const auto w0 = read_dense_epoch(tt.train, std::make_unique<SequentialSampler>(7), 0, 3);
  const auto w2 = read_dense_epoch(tt.train, std::make_unique<SequentialSampler>(7), 2, 3);
  ASSERT_EQ(w0.size(), 3u);  // 3 + 3 + 1
  expect_dense_batches(tt.train, fanout::testing::iota(7), w0);
  EXPECT_TRUE(same_epochs(w0, w2)) << "workers 0 and 2 differ";
}

TEST(KeypointLoader, DenseTargetsOfLoadedVolumes) {
  ScratchDir dir;
  std::mt19937_64 rng(10);
  const auto train = make_vols({"v0", "v1", "v2", "v3", "v4", "v5"}, Shape{2, 6, 7, 8}, DType::F64, 3, rng);
  write_split(dir.path() / "train", train, Format::Json);
  write_split(dir.path() / "test", make_vols({"w"}, Shape{2, 6, 7, 8}, DType::F64, 3, rng), Format::Csv);
  const TrainTest tt = load_keypoints3d(dir.path().string(), HeatmapSpec{1, 0.8});
  RandomSampler probe(6, 99);
  probe.set_epoch(0);
  const std::vector<int64_t> order = probe.indices();
  const auto w0 = read_dense_epoch(tt.train, std::make_unique<RandomSampler>(6, 99), 0, 4);
  const auto w2 = read_dense_epoch(tt.train, std::make_unique<RandomSampler>(6, 99), 2, 4);
  ASSERT_EQ(w0.size(), 2u);
  expect_dense_batches(tt.train, order, w0);
  EXPECT_TRUE(same_epochs(w0, w2)) << "workers 0 and 2 differ";
}

TEST(KeypointLoader, DenseTargetsRefuseAugmentation) {
  const TrainTest tt = make_synthetic3d(3, 1, {});
  for (const char* spec : {"flip", "crop:2", "crop:4,flip"}) {
    SCOPED_TRACE(spec);
    LoaderOptions o;
    o.batch_size = 2;
    o.augment = parse_augment(spec);
    for (int workers : {0, 2}) {
      o.workers = workers;
      expect_user_error([&] { DataLoader dl(tt.train, std::make_unique<SequentialSampler>(3), o); },
                        {"synthetic3d/train", "augmentation"});
    }
  }
}

}  // namespace
}  // namespace fanout::data
