// WebDataset tar shards: header index, samples grouped by key, image-file datasets over them.
#include "runtime/data/wds.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>

#include "runtime/core/error.h"

namespace fanout::data {

namespace fs = std::filesystem;

namespace {

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly n bytes at offset; false at the end of the file.
bool read_at(int fd, uint8_t* out, size_t n, int64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, n - done, offset + static_cast<int64_t>(done));
    FANOUT_USER_CHECK(got >= 0) << "cannot read shard " << path << ": " << std::strerror(errno);
    if (got == 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

// A header's octal number field (NUL or space ended), or -1.
int64_t octal(const uint8_t* p, size_t n) {
  int64_t v = 0;
  size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i, any = true) v = v * 8 + (p[i] - '0');
  for (; i < n; ++i)
    if (p[i] != ' ' && p[i] != 0) return -1;
  return any ? v : -1;
}

std::string field(const uint8_t* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), strnlen(reinterpret_cast<const char*>(p), n)); }

}  // namespace

std::vector<TarMember> list_tar(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  FANOUT_USER_CHECK(f.fd >= 0) << "cannot read shard " << path << ": " << std::strerror(errno);
  struct stat st {};
  FANOUT_USER_CHECK(::fstat(f.fd, &st) == 0) << "cannot read shard " << path << ": " << std::strerror(errno);
  const int64_t file_size = st.st_size;
  std::vector<TarMember> out;
  std::string long_name;  // from a GNU 'L' or a pax header, for the next member
  uint8_t h[512];
  for (int64_t at = 0;;) {
    FANOUT_USER_CHECK(at >= file_size || at + 512 <= file_size)
        << "shard " << path << " ends inside a member's header at byte " << at << " (truncated)";
    if (!read_at(f.fd, h, 512, at, path)) break;  // no end blocks: tolerated, as Python's tarfile does
    if (std::all_of(h, h + 512, [](uint8_t b) { return b == 0; })) break;
    int64_t sum = 0;
    for (int i = 0; i < 512; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    FANOUT_USER_CHECK(octal(h + 148, 8) == sum)
        << "shard " << path << " is not a tar file or is corrupt (bad header checksum at byte " << at << ")";
    const int64_t size = octal(h + 124, 12);
    FANOUT_USER_CHECK(size >= 0) << "shard " << path << ": bad member size at byte " << at;
    const int64_t data = at + 512;
    FANOUT_USER_CHECK(data + size <= file_size)
        << "shard " << path << " ends inside member '" << field(h, 100) << "' (truncated)";
    const char type = static_cast<char>(h[156]);
    if (type == 'L' || type == 'x') {
      std::string body(static_cast<size_t>(size), '\0');
      read_at(f.fd, reinterpret_cast<uint8_t*>(body.data()), body.size(), data, path);
      if (type == 'L') {
        long_name = body.substr(0, body.find('\0'));
      } else {
        // pax records: "LEN key=value\n"; only the path matters here.
        for (size_t p = 0; p < body.size();) {
          const size_t sp = body.find(' ', p);
          int64_t len = 0;
          if (sp == std::string::npos || std::from_chars(body.data() + p, body.data() + sp, len).ec != std::errc() ||
              len <= 0 || p + static_cast<size_t>(len) > body.size())
            break;
          const std::string rec = body.substr(sp + 1, static_cast<size_t>(len) - (sp + 1 - p) - 1);
          if (rec.rfind("path=", 0) == 0) long_name = rec.substr(5);
          p += static_cast<size_t>(len);
        }
      }
    } else if (type == '0' || type == '\0' || type == '7') {
      std::string name = long_name;
      if (name.empty()) {
        const std::string prefix = std::memcmp(h + 257, "ustar", 5) == 0 ? field(h + 345, 155) : "";
        name = (prefix.empty() ? "" : prefix + "/") + field(h, 100);
      }
      out.push_back({name, data, size});
      long_name.clear();
    } else {
      long_name.clear();  // folders, links and the rest carry no sample
    }
    at = data + (size + 511) / 512 * 512;
  }
  return out;
}

namespace {

bool image_ext(std::string e) {
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return e == "jpg" || e == "jpeg" || e == "png";
}

struct ShardSamples {
  std::vector<ImageFileDataset::File> files;
};

// The samples of one shard, in the order their keys first appear.
ShardSamples read_shard(const std::string& path) {
  const std::vector<TarMember> members = list_tar(path);
  struct Sample {
    const TarMember* image = nullptr;
    const TarMember* cls = nullptr;
    const TarMember* dotted = nullptr;  // a field such as "000.jpg": an image or label under another name
  };
  std::vector<std::string> order;
  std::map<std::string, Sample> by_key;
  for (const TarMember& m : members) {
    const size_t slash = m.name.rfind('/');
    const size_t base = slash == std::string::npos ? 0 : slash + 1;
    const size_t dot = m.name.find('.', base);
    // No key before the dot: a hidden file (macOS's ._NAME), as WebDataset skips it.
    if (dot == std::string::npos || dot == base) continue;
    const std::string key = m.name.substr(0, dot), ext = m.name.substr(dot + 1);
    const bool img = image_ext(ext), cls = ext == "cls";
    const size_t last = ext.rfind('.');
    const bool dotted = last != std::string::npos && (image_ext(ext.substr(last + 1)) || ext.substr(last + 1) == "cls");
    if (!img && !cls && !dotted) continue;  // other members (.json, .txt...) are not used
    auto [it, fresh] = by_key.try_emplace(key);
    if (fresh) order.push_back(key);
    if (dotted) {
      if (!it->second.dotted) it->second.dotted = &m;
      continue;
    }
    const TarMember*& slot = img ? it->second.image : it->second.cls;
    FANOUT_USER_CHECK(slot == nullptr) << "shard " << path << ": sample '" << key << "' has two "
                                       << (img ? "images" : ".cls members");
    slot = &m;
  }
  ShardSamples s;
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  FANOUT_USER_CHECK(f.fd >= 0) << "cannot read shard " << path << ": " << std::strerror(errno);
  for (const std::string& key : order) {
    const Sample& smp = by_key[key];
    // WebDataset's key ends at the first dot of the name: img.000.jpg is field "000.jpg" of sample "img".
    if (!smp.image && !smp.cls && smp.dotted) {
      const std::string& n = smp.dotted->name;
      FANOUT_FAIL() << "shard " << path << ": member " << n << " is field '" << n.substr(key.size() + 1)
                    << "' of sample '" << key << "', which has no image or .cls (a sample's key ends at the first "
                    << "dot of the name, as WebDataset's: rename such files KEY.jpg and KEY.cls)";
    }
    FANOUT_USER_CHECK(smp.image != nullptr) << "shard " << path << ": sample '" << key
                                            << "' has no image (.jpg, .jpeg or .png)";
    FANOUT_USER_CHECK(smp.cls != nullptr) << "shard " << path << ": sample '" << key << "' has no .cls";
    FANOUT_USER_CHECK(smp.cls->size <= 32) << "shard " << path << ": " << smp.cls->name << " is not a class index";
    char text[33] = {};
    read_at(f.fd, reinterpret_cast<uint8_t*>(text), static_cast<size_t>(smp.cls->size), smp.cls->offset, path);
    const char *b = text, *e = text + smp.cls->size;
    while (b < e && std::isspace(static_cast<unsigned char>(*b))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(e[-1]))) --e;
    int32_t label = -1;
    const auto [end, ec] = std::from_chars(b, e, label);
    FANOUT_USER_CHECK(b != e && ec == std::errc() && end == e && label >= 0)
        << "shard " << path << ": " << smp.cls->name << " holds '" << std::string(b, e)
        << "', not a class index (a whole number from 0)";
    ImageFileDataset::File file;
    file.path = path;
    file.label = label;
    file.offset = smp.image->offset;
    file.size = smp.image->size;
    file.member = smp.image->name;
    s.files.push_back(std::move(file));
  }
  return s;
}

std::vector<std::string> shards(const std::string& dir, const std::string& split) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(split + "-", 0) == 0 && name.size() > split.size() + 5 && name.substr(name.size() - 4) == ".tar")
      out.push_back(it->path().string());
  }
  FANOUT_USER_CHECK(!ec) << "cannot list wds:" << dir << ": " << ec.message();
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

ImageFolderSplits open_wds(const std::string& dir, const Augment& augment, const std::string& normalize,
                           bool skip_bad) {
  check_image_dir("wds", dir);
  for (const char* split : {"train", "val"})
    FANOUT_USER_CHECK(!shards(dir, split).empty()) << "wds:" << dir << " has no " << split << "-*.tar shards";
  check_output_size("wds", dir, augment);
  std::vector<float> mean, std;
  parse_normalize(normalize, mean, std);
  ImageFolderSplits s;
  int32_t classes = 0;
  for (const char* split : {"train", "val"}) {
    const std::vector<std::string> paths = shards(dir, split);
    std::vector<ImageFileDataset::File> files;
    std::vector<int64_t> sizes;
    for (const std::string& p : paths) {
      ShardSamples one = read_shard(p);
      FANOUT_USER_CHECK(!one.files.empty()) << "shard " << p << " holds no samples (KEY.jpg or KEY.png beside KEY.cls)";
      sizes.push_back(static_cast<int64_t>(one.files.size()));
      for (auto& f : one.files) files.push_back(std::move(f));
    }
    const bool train = std::strcmp(split, "train") == 0;
    int32_t top = 0;
    for (const auto& f : files) top = std::max(top, f.label + 1);
    if (train) {
      classes = top;
      std::vector<int32_t> used;
      for (const auto& f : files) used.push_back(f.label);
      std::sort(used.begin(), used.end());
      const int64_t n = std::unique(used.begin(), used.end()) - used.begin();
      // The model's classes come from the largest label: a mistyped one makes a far larger head.
      if (n < top)
        s.warnings.push_back("wds:" + dir + ": " + std::to_string(top) + " classes (0.." + std::to_string(top - 1) +
                             ", from the largest .cls of the training shards), " + std::to_string(n) +
                             " of them with training samples");
    }
    FANOUT_USER_CHECK(top <= classes) << "wds:" << dir << ": validation has class " << top - 1
                                      << ", beyond the training shards' classes 0.." << classes - 1;
    std::vector<std::string> names;
    for (int32_t c = 0; c < classes; ++c) names.push_back(std::to_string(c));
    auto ds = std::make_shared<ImageFileDataset>(std::move(files), std::move(names),
                                                 train ? augment : eval_pipeline(augment), mean, std,
                                                 "wds:" + dir + "/" + split, skip_bad);
    if (train) ds->set_shards(std::move(sizes), kWdsShuffleBuffer);
    (train ? s.train : s.val) = std::move(ds);
  }
  return s;
}

}  // namespace fanout::data
