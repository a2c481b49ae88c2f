// keypoints3d:DIR, the reader of keypoints.h: .npy volumes and their landmarks
// (landmarks.json or landmarks.csv) per split. Every problem is one line
// naming the file.
//
// In a split directory, files other than *.npy and the landmark file (a
// README, subdirectories) are ignored; every *.npy is a volume.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/core/half.h"
#include "runtime/data/keypoints.h"
#include "runtime/io/file_io.h"
#include "runtime/io/npy.h"

namespace fanout::data {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxLandmarks = 4096;
constexpr uintmax_t kMaxLandmarkFileBytes = uintmax_t{256} << 20;
constexpr const char* kCsvHeader = "name,landmark,z,y,x";

// Text from a landmark file for a one-line message: quoted, control bytes as \xNN.
std::string shown(const std::string& s) { return io::detail::quoted(s, /*escape_non_ascii=*/false); }

// One volume's K landmarks, (z, y, x) each.
struct Landmarks {
  std::vector<float> zyx;  // K * 3
  int64_t k = 0;
};

// name -> landmarks, from one split's landmark file.
using LandmarkMap = std::map<std::string, Landmarks>;

std::string read_text(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  FANOUT_USER_CHECK(!ec) << "keypoints3d: cannot read " << path << ": " << ec.message();
  FANOUT_USER_CHECK(size <= kMaxLandmarkFileBytes)
      << "keypoints3d: " << path << " is " << size << " bytes; landmark files are limited to "
      << (kMaxLandmarkFileBytes >> 20) << " MiB";
  std::ifstream in(path, std::ios::binary);
  FANOUT_USER_CHECK(in.good()) << "keypoints3d: cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  FANOUT_USER_CHECK(!in.bad()) << "keypoints3d: cannot read " << path;
  return ss.str();
}

// A coordinate as float32: finite (as float32 too), else an error naming the place.
float coordinate(double v, const std::string& where) {
  const float f = static_cast<float>(v);
  FANOUT_USER_CHECK(std::isfinite(v) && std::isfinite(f)) << where << " is not a finite float32 (" << v << ")";
  return f;
}

void check_k(int64_t k, const std::string& path, const std::string& name) {
  FANOUT_USER_CHECK(k >= 1) << "keypoints3d: " << path << ": volume " << shown(name)
                            << " has no landmarks (K must be at least 1)";
  FANOUT_USER_CHECK(k <= kMaxLandmarks) << "keypoints3d: " << path << ": volume " << shown(name) << " has " << k
                                        << " landmarks; at most " << kMaxLandmarks << " are supported";
}

// landmarks.json: {"NAME": [[z, y, x], ...], ...}; no key twice.
LandmarkMap parse_json(const std::string& path) {
  const std::string text = read_text(path);
  std::vector<std::string> keys;  // top-level keys, for the duplicate check
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
      if (depth == 1 && ev == nlohmann::json::parse_event_t::key) keys.push_back(v.get<std::string>());
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    FANOUT_FAIL() << "keypoints3d: " << path << " is not valid JSON (" << what << ")";
  }
  FANOUT_USER_CHECK(doc.is_object()) << "keypoints3d: " << path << " is not a JSON object {\"NAME\": [[z, y, x], ...], ...}";
  std::sort(keys.begin(), keys.end());
  const auto dup = std::adjacent_find(keys.begin(), keys.end());
  FANOUT_USER_CHECK(dup == keys.end()) << "keypoints3d: " << path << ": volume " << shown(*dup)
                                       << " appears twice";
  LandmarkMap out;
  for (const auto& [name, list] : doc.items()) {
    const std::string who = "keypoints3d: " + path + ": volume " + shown(name);
    FANOUT_USER_CHECK(list.is_array()) << who << " has no list of [z, y, x] landmarks (got " << list.type_name() << ")";
    const int64_t k = static_cast<int64_t>(list.size());
    check_k(k, path, name);
    Landmarks& lm = out[name];
    lm.k = k;
    lm.zyx.reserve(static_cast<size_t>(k * 3));
    for (int64_t i = 0; i < k; ++i) {
      const nlohmann::json& p = list[static_cast<size_t>(i)];
      FANOUT_USER_CHECK(p.is_array() && p.size() == 3)
          << who << ": landmark " << i << " is not a list [z, y, x] of 3 numbers";
      for (int a = 0; a < 3; ++a) {
        const std::string where = who + ": landmark " + std::to_string(i) + " " + "zyx"[a];
        FANOUT_USER_CHECK(p[static_cast<size_t>(a)].is_number()) << where << " is not a number";
        lm.zyx.push_back(coordinate(p[static_cast<size_t>(a)].get<double>(), where));
      }
    }
  }
  return out;
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  for (;;) {
    const size_t e = line.find(sep, b);
    out.push_back(line.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) return out;
    b = e + 1;
  }
}

// landmarks.csv: the header, then rows "name,landmark,z,y,x" (fields verbatim:
// no quoting, no spaces; "\r\n" line ends are fine). K of a volume is the
// number of its rows; its indices must be 0..K-1, each once.
LandmarkMap parse_csv(const std::string& path) {
  const std::string text = read_text(path);
  std::vector<std::string> lines = split(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();  // the final newline
  for (std::string& l : lines)
    if (!l.empty() && l.back() == '\r') l.pop_back();
  FANOUT_USER_CHECK(!lines.empty() && lines[0] == kCsvHeader)
      << "keypoints3d: " << path << ": the first line must be the header " << kCsvHeader << ", got "
      << shown(lines.empty() ? std::string() : lines[0]);
  struct Row {
    float zyx[3];
    size_t line;
  };
  std::map<std::string, std::map<int64_t, Row>> rows;
  for (size_t li = 1; li < lines.size(); ++li) {
    const std::string at = "keypoints3d: " + path + ": line " + std::to_string(li + 1);
    const std::vector<std::string> f = split(lines[li], ',');
    FANOUT_USER_CHECK(f.size() == 5) << at << " has " << f.size() << " fields, expected 5 (" << kCsvHeader << "): "
                                     << shown(lines[li]);
    FANOUT_USER_CHECK(!f[0].empty()) << at << " has an empty name";
    int64_t idx = -1;
    const char* b = f[1].data();
    const char* e = b + f[1].size();
    const auto [p, ec] = std::from_chars(b, e, idx);
    FANOUT_USER_CHECK(!f[1].empty() && ec == std::errc() && p == e && idx >= 0 && idx < kMaxLandmarks)
        << at << ": landmark index " << shown(f[1]) << " is not a whole number in 0.." << kMaxLandmarks - 1;
    Row r{{0, 0, 0}, li + 1};
    for (int a = 0; a < 3; ++a) {
      const std::string& s = f[static_cast<size_t>(2 + a)];
      const std::string where = at + ": " + "zyx"[a] + " " + shown(s);
      double v = 0;
      const auto [q, vec] = std::from_chars(s.data(), s.data() + s.size(), v);
      FANOUT_USER_CHECK(!s.empty() && vec == std::errc() && q == s.data() + s.size()) << where << " is not a number";
      r.zyx[a] = coordinate(v, where);
    }
    const auto [it, fresh] = rows[f[0]].emplace(idx, r);
    FANOUT_USER_CHECK(fresh) << at << ": landmark " << idx << " of volume " << shown(f[0])
                             << " was already given on line " << it->second.line;
  }
  LandmarkMap out;
  for (const auto& [name, byidx] : rows) {
    const int64_t k = static_cast<int64_t>(byidx.size());
    check_k(k, path, name);
    // Indices are distinct and >= 0: they are 0..K-1 iff the largest is K-1.
    if (byidx.rbegin()->first != k - 1) {
      int64_t missing = 0;
      while (byidx.count(missing)) ++missing;
      FANOUT_FAIL() << "keypoints3d: " << path << ": volume " << shown(name) << " has landmark "
                    << byidx.rbegin()->first << " (line " << byidx.rbegin()->second.line << ") but no landmark "
                    << missing << " (indices must be 0..K-1, each once)";
    }
    Landmarks& lm = out[name];
    lm.k = k;
    for (const auto& [i, r] : byidx) lm.zyx.insert(lm.zyx.end(), r.zyx, r.zyx + 3);
  }
  return out;
}

// Converts a loaded volume to float32 into dst; non-finite values are refused.
template <class T>
void convert(const T* src, int64_t n, float* dst, const std::string& path) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
    if constexpr (std::is_floating_point_v<T>) {
      FANOUT_USER_CHECK(std::isfinite(dst[i])) << "keypoints3d: " << path << ": voxel " << i << " is " << src[i]
                                               << ", not a finite float32";
    }
  }
}

void to_float(const Tensor& t, float* dst, const std::string& path) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::F32: return convert(t.data<float>(), n, dst, path);
    case DType::F64: return convert(t.data<double>(), n, dst, path);
    case DType::I32: return convert(t.data<int32_t>(), n, dst, path);
    case DType::I64: return convert(t.data<int64_t>(), n, dst, path);
    case DType::U8: return convert(t.data<uint8_t>(), n, dst, path);
    case DType::F16:
    case DType::BF16: {
      std::vector<float> wide(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = t.data<uint16_t>()[i];
        wide[i] = t.dtype() == DType::F16 ? half::float_from_f16(h) : half::float_from_bf16(h);
      }
      return convert(wide.data(), n, dst, path);
    }
  }
  FANOUT_FAIL() << "keypoints3d: " << path << ": unsupported dtype " << dtype_name(t.dtype());
}

// (C, D, H, W) of a loaded volume: (D, H, W) gets C = 1.
Shape volume_shape(const Tensor& t, const std::string& path) {
  FANOUT_USER_CHECK(t.dim() == 3 || t.dim() == 4)
      << "keypoints3d: " << path << " is " << t.shape().str() << ", expected (D, H, W) or (C, D, H, W)";
  Shape s{1, 1, 1, 1};
  for (int i = 0; i < t.dim(); ++i) s[4 - t.dim() + i] = t.size(i);
  FANOUT_USER_CHECK(s.numel() > 0) << "keypoints3d: " << path << " is " << t.shape().str() << ", an empty volume";
  return s;
}

struct Split {
  ImageDataset ds;
  std::string first_volume;    // path, for messages about the whole split
  std::string landmark_file;
  std::string warning;         // landmarks outside their volume, if any
};

Split load_split(const fs::path& dir, const std::string& name, const HeatmapSpec& heatmap) {
  const std::string d = dir.string();
  std::error_code ec;
  FANOUT_USER_CHECK(fs::is_directory(dir, ec)) << "keypoints3d: " << d << " is not a directory"
                                               << (fs::exists(dir, ec) ? "" : " (it does not exist)");
  std::map<std::string, std::string> volumes;  // stem -> path, sorted by name
  bool has_json = false, has_csv = false;
  fs::directory_iterator it(dir, ec), end;
  FANOUT_USER_CHECK(!ec) << "keypoints3d: cannot list " << d << ": " << ec.message();
  for (; it != end; it.increment(ec)) {
    FANOUT_USER_CHECK(!ec) << "keypoints3d: cannot list " << d << ": " << ec.message();
    const std::string f = it->path().filename().string();
    if (f == "landmarks.json") has_json = true;
    else if (f == "landmarks.csv") has_csv = true;
    else if (f.size() >= 4 && f.compare(f.size() - 4, 4, ".npy") == 0) {
      FANOUT_USER_CHECK(f.size() > 4) << "keypoints3d: " << (dir / f).string()
                                      << " has an empty name (volumes are named by their file's stem)";
      volumes.emplace(f.substr(0, f.size() - 4), (dir / f).string());
    }
  }
  FANOUT_USER_CHECK(ec.value() == 0) << "keypoints3d: cannot list " << d << ": " << ec.message();
  FANOUT_USER_CHECK(!volumes.empty()) << "keypoints3d: " << d << " holds no .npy volumes";
  const std::string json_path = (dir / "landmarks.json").string(), csv_path = (dir / "landmarks.csv").string();
  FANOUT_USER_CHECK(!(has_json && has_csv))
      << "keypoints3d: " << d << " holds both " << json_path << " and " << csv_path << "; keep one";
  FANOUT_USER_CHECK(has_json || has_csv)
      << "keypoints3d: " << d << " has no landmark file (landmarks.json or landmarks.csv)";
  const std::string lm_path = has_json ? json_path : csv_path;
  FANOUT_USER_CHECK(fs::is_regular_file(lm_path, ec)) << "keypoints3d: " << lm_path << " is not a regular file";
  const LandmarkMap lms = has_json ? parse_json(lm_path) : parse_csv(lm_path);

  // Every volume has landmarks, all volumes the same K, and no landmarks without a volume.
  for (const auto& [stem, lm] : lms)
    FANOUT_USER_CHECK(volumes.count(stem)) << "keypoints3d: " << lm_path << " has landmarks for volume " << shown(stem)
                                           << " but " << d << " has no " << shown(stem + ".npy");
  for (const auto& [stem, path] : volumes)
    FANOUT_USER_CHECK(lms.count(stem)) << "keypoints3d: " << path << " has no landmarks in " << lm_path;
  const std::string& first = volumes.begin()->first;
  const int64_t k = lms.at(first).k;
  for (const auto& [stem, lm] : lms)
    FANOUT_USER_CHECK(lm.k == k) << "keypoints3d: " << lm_path << ": volume " << shown(stem) << " has " << lm.k
                                 << " landmarks but " << shown(first) << " has " << k;

  const int64_t n = static_cast<int64_t>(volumes.size());
  Split out;
  out.first_volume = volumes.begin()->second;
  out.landmark_file = lm_path;
  ImageDataset& ds = out.ds;
  ds.name = name;
  ds.heatmap = heatmap;
  ds.num_classes = static_cast<int>(k);
  ds.landmarks = Tensor::empty(Shape{n, k, 3}, DType::F32);
  Shape vs;  // (C, D, H, W) of the first volume
  int64_t i = 0, outside = 0, out_volumes = 0;
  std::string first_outside;
  for (const auto& [stem, path] : volumes) {
    Tensor v;
    try {
      v = io::load_npy(path);
    } catch (const Error& e) {
      FANOUT_FAIL() << "keypoints3d: " << e.what();  // e names the file
    }
    const Shape s = volume_shape(v, path);
    if (i == 0) {
      vs = s;
      int64_t total = 0;
      FANOUT_USER_CHECK(!__builtin_mul_overflow(n, s.numel(), &total) && total <= (int64_t{1} << 60))
          << "keypoints3d: " << d << ": " << n << " volumes " << s.str() << " are too many voxels";
      ds.images = Tensor::empty(Shape{n, s[0], s[1], s[2], s[3]}, DType::F32);
    }
    FANOUT_USER_CHECK(s == vs) << "keypoints3d: " << path << " is " << s.str() << " (C, D, H, W) but "
                               << out.first_volume << " is " << vs.str();
    to_float(v, ds.images.f32() + i * vs.numel(), path);
    const Landmarks& lm = lms.at(stem);
    std::copy(lm.zyx.begin(), lm.zyx.end(), ds.landmarks.f32() + i * k * 3);
    // A landmark whose voxel (each coordinate rounded, as the heatmap's
    // floor(c + 0.5)) is outside [0, size - 1] on an axis lies outside the
    // volume: allowed (its target is the part of the Gaussian inside), but worth a word.
    int64_t here = 0;
    for (int64_t j = 0; j < k; ++j)
      for (int a = 0; a < 3; ++a) {
        const double c = std::floor(static_cast<double>(lm.zyx[static_cast<size_t>(j * 3 + a)]) + 0.5);
        if (c < 0 || c > static_cast<double>(vs[a + 1] - 1)) {
          ++here;
          break;
        }
      }
    if (here > 0) {
      if (out_volumes++ == 0) first_outside = path;
      outside += here;
    }
    ++i;
  }
  if (outside > 0)
    out.warning = "keypoints3d: " + lm_path + ": " + std::to_string(outside) + " landmark" + (outside == 1 ? "" : "s") +
                  " of " + std::to_string(out_volumes) + " volume" + (out_volumes == 1 ? "" : "s") +
                  (outside == 1 ? " lies" : " lie") + " outside the volume (first: " + first_outside +
                  "); the targets hold the part of the Gaussian inside it";
  return out;
}

// Per-channel mean and population std of float32 volumes (N, C, D, H, W), in
// double, two passes; a constant channel (or one too flat for float32) gets std 1.
void float_channel_mean_std(const Tensor& images, std::vector<float>& mean, std::vector<float>& std) {
  const int64_t n = images.size(0), c = images.size(1), plane = images.numel() / (n * c);
  const float* x = images.f32();
  mean.assign(static_cast<size_t>(c), 0.0f);
  std.assign(static_cast<size_t>(c), 1.0f);
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* p = x + (i * c + ch) * plane;
      for (int64_t v = 0; v < plane; ++v) s += p[v];
    }
    const double cnt = static_cast<double>(n) * static_cast<double>(plane), m = s / cnt;
    double s2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* p = x + (i * c + ch) * plane;
      for (int64_t v = 0; v < plane; ++v) s2 += (p[v] - m) * (p[v] - m);
    }
    mean[static_cast<size_t>(ch)] = static_cast<float>(m);
    const float sd = static_cast<float>(std::sqrt(s2 / cnt));
    if (sd >= std::numeric_limits<float>::min() && std::isfinite(1.0f / sd)) std[static_cast<size_t>(ch)] = sd;
  }
}

}  // namespace

TrainTest load_keypoints3d(const std::string& dir, const HeatmapSpec& heatmap) {
  FANOUT_USER_CHECK(!dir.empty()) << "keypoints3d: no directory given (keypoints3d:DIR)";
  std::error_code ec;
  FANOUT_USER_CHECK(fs::is_directory(dir, ec)) << "keypoints3d: " << dir << " is not a directory"
                                               << (fs::exists(dir, ec) ? "" : " (it does not exist)");
  Split train = load_split(fs::path(dir) / "train", "keypoints3d/train", heatmap);
  Split test = load_split(fs::path(dir) / "test", "keypoints3d/test", heatmap);
  FANOUT_USER_CHECK(train.ds.sample_shape() == test.ds.sample_shape())
      << "keypoints3d: " << test.first_volume << " is " << test.ds.sample_shape().str() << " (C, D, H, W) but "
      << train.first_volume << " is " << train.ds.sample_shape().str();
  FANOUT_USER_CHECK(train.ds.num_classes == test.ds.num_classes)
      << "keypoints3d: " << test.landmark_file << " has " << test.ds.num_classes << " landmarks per volume but "
      << train.landmark_file << " has " << train.ds.num_classes;
  float_channel_mean_std(train.ds.images, train.ds.mean, train.ds.std);
  test.ds.mean = train.ds.mean;
  test.ds.std = train.ds.std;
  TrainTest tt{std::move(train.ds), std::move(test.ds), {}};
  for (const Split* s : {&train, &test})
    if (!s->warning.empty()) tt.warnings.push_back(s->warning);
  return tt;
}

}  // namespace fanout::data
