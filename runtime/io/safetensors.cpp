// safetensors reading and writing. The header is parsed by a SAX handler that
// checks the schema as it goes: memory stays proportional to the number of
// tensors (never to nesting or list lengths), and the first problem found
// becomes the error message.
#include "runtime/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/io/file_io.h"

namespace fanout::io {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;

std::string quote_name(const std::string& s) { return detail::quoted(s, /*escape_non_ascii=*/false); }

bool parse_dtype(const std::string& s, DType* t) {
  if (s == "F32") *t = DType::F32;
  else if (s == "I32") *t = DType::I32;
  else if (s == "I64") *t = DType::I64;
  else if (s == "U8") *t = DType::U8;
  else if (s == "F64") *t = DType::F64;
  else if (s == "BF16") *t = DType::BF16;
  else if (s == "F16") *t = DType::F16;
  else return false;
  return true;
}

// One header entry as the JSON spelled it, before validation.
struct RawEntry {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<uint64_t> offsets;
  bool has_dtype = false, has_shape = false, has_offsets = false;
};

// SAX handler for the header. Expected layout:
//   {"<name>": {"dtype": str, "shape": [uint...], "data_offsets": [uint, uint], <other keys ignored>},
//    "__metadata__": {str: str}}
// Returns false (stopping the parse) with `error` set at the first deviation.
class HeaderSax final : public nlohmann::json_sax<json> {
 public:
  std::vector<RawEntry> entries;
  std::map<std::string, std::string> metadata;
  std::string error;

  bool null() override { return scalar(Kind::Other, 0, nullptr); }
  bool boolean(bool) override { return scalar(Kind::Other, 0, nullptr); }
  bool number_integer(number_integer_t v) override {
    // nlohmann reports only negative integers here ("-0" included).
    return v >= 0 ? scalar(Kind::Uint, static_cast<uint64_t>(v), nullptr) : scalar(Kind::Other, 0, nullptr);
  }
  bool number_unsigned(number_unsigned_t v) override { return scalar(Kind::Uint, v, nullptr); }
  bool number_float(number_float_t, const string_t&) override { return scalar(Kind::Other, 0, nullptr); }
  bool string(string_t& v) override { return scalar(Kind::String, 0, &v); }
  bool binary(binary_t&) override { return scalar(Kind::Other, 0, nullptr); }

  bool start_object(std::size_t) override {
    if (skip_depth_ > 0) return ++skip_depth_, true;
    if (stack_.empty()) return stack_.push_back(Frame::Top), true;
    switch (stack_.back()) {
      case Frame::Top:
        if (key_ == "__metadata__") {
          stack_.push_back(Frame::Meta);
        } else {
          entries.push_back(RawEntry{key_, {}, {}, {}});
          stack_.push_back(Frame::Entry);
        }
        return true;
      case Frame::Entry:
        if (is_known_entry_key(key_)) return wrong_entry_value();
        skip_depth_ = 1;  // an unknown key's value: ignored, as the reference does
        return true;
      default: return scalar(Kind::Other, 0, nullptr);
    }
  }

  bool start_array(std::size_t) override {
    if (skip_depth_ > 0) return ++skip_depth_, true;
    if (stack_.empty() || stack_.back() != Frame::Entry) return scalar(Kind::Other, 0, nullptr);
    if (key_ == "shape") return stack_.push_back(Frame::Shape), true;
    if (key_ == "data_offsets") return stack_.push_back(Frame::Offsets), true;
    if (key_ == "dtype") return wrong_entry_value();
    skip_depth_ = 1;
    return true;
  }

  bool end_object() override {
    if (skip_depth_ > 0) return --skip_depth_, true;
    const Frame f = stack_.back();
    stack_.pop_back();
    if (f == Frame::Entry) {
      const RawEntry& e = entries.back();
      const char* missing = !e.has_dtype ? "dtype" : !e.has_shape ? "shape" : !e.has_offsets ? "data_offsets" : nullptr;
      if (missing) return fail("tensor " + quote_name(e.name) + " has no \"" + missing + "\"");
    }
    return true;
  }

  bool end_array() override {
    if (skip_depth_ > 0) return --skip_depth_, true;
    stack_.pop_back();
    return true;
  }

  bool key(string_t& k) override {
    if (skip_depth_ > 0) return true;
    switch (stack_.back()) {
      case Frame::Top:
        if (!names_.insert(k).second) return fail("key " + quote_name(k) + " appears twice in the header");
        break;
      case Frame::Entry: {
        RawEntry& e = entries.back();
        bool* seen = k == "dtype" ? &e.has_dtype : k == "shape" ? &e.has_shape : k == "data_offsets" ? &e.has_offsets : nullptr;
        if (seen && *seen) return fail("tensor " + quote_name(e.name) + " has \"" + k + "\" twice");
        if (seen) *seen = true;
        break;
      }
      case Frame::Meta:
        if (metadata.count(k)) return fail("__metadata__ key " + quote_name(k) + " appears twice");
        break;
      default: break;
    }
    key_ = k;
    return true;
  }

  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& ex) override {
    std::string msg = ex.what();
    if (msg.size() > 300) msg = msg.substr(0, 300) + "...";
    return fail("malformed JSON header (byte " + std::to_string(pos) + "): " + msg);
  }

 private:
  enum class Frame { Top, Entry, Meta, Shape, Offsets };
  enum class Kind { Uint, String, Other };

  static bool is_known_entry_key(const std::string& k) {
    return k == "dtype" || k == "shape" || k == "data_offsets";
  }

  bool fail(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return false;
  }

  bool wrong_entry_value() {
    const std::string& n = entries.back().name;
    if (key_ == "dtype") return fail("tensor " + quote_name(n) + ": \"dtype\" is not a string");
    if (key_ == "shape") return fail("tensor " + quote_name(n) + ": \"shape\" is not a list of non-negative integers");
    return fail("tensor " + quote_name(n) + ": \"data_offsets\" is not [begin, end] (non-negative integers)");
  }

  // A scalar value, or an object/array where the schema wants something else.
  bool scalar(Kind kind, uint64_t u, const std::string* s) {
    if (skip_depth_ > 0) return true;
    if (stack_.empty()) return fail("header is not a JSON object");
    switch (stack_.back()) {
      case Frame::Top:
        if (key_ == "__metadata__") return fail("__metadata__ is not an object");
        return fail("entry " + quote_name(key_) + " is not an object");
      case Frame::Entry:
        if (key_ == "dtype") {
          if (kind != Kind::String) return wrong_entry_value();
          entries.back().dtype = *s;
        } else if (is_known_entry_key(key_)) {
          return wrong_entry_value();
        }
        return true;
      case Frame::Meta:
        if (kind != Kind::String) return fail("__metadata__ value of " + quote_name(key_) + " is not a string");
        metadata.emplace(key_, *s);
        return true;
      case Frame::Shape: {
        RawEntry& e = entries.back();
        if (kind != Kind::Uint) return wrong_entry_value();
        if (e.shape.size() == static_cast<size_t>(Shape::kMaxDims))
          return fail("tensor " + quote_name(e.name) + " has more than " + std::to_string(Shape::kMaxDims) +
                      " dims (fanout tensors have at most " + std::to_string(Shape::kMaxDims) + ")");
        e.shape.push_back(u);
        return true;
      }
      case Frame::Offsets: {
        RawEntry& e = entries.back();
        if (kind != Kind::Uint || e.offsets.size() == 2) return wrong_entry_value();
        e.offsets.push_back(u);
        return true;
      }
    }
    return true;
  }

  std::vector<Frame> stack_;
  int64_t skip_depth_ = 0;  // > 0 inside the value of an ignored key
  std::string key_;
  std::set<std::string> names_;
};

// A validated entry.
struct Entry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // within the data buffer
};

struct Header {
  std::vector<Entry> entries;  // by data offset, then header order
  std::map<std::string, std::string> metadata;
};

std::string shape_text(const std::vector<uint64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

// Parses and validates the JSON header `hdr` (n bytes) of a file whose data
// buffer holds `data_size` bytes.
Header parse_header(const uint8_t* hdr, uint64_t n, uint64_t data_size, const std::string& what) {
  HeaderSax sax;
  bool ok = false;
  try {
    ok = json::sax_parse(hdr, hdr + n, &sax, json::input_format_t::json, /*strict=*/true);
  } catch (const json::exception& e) {
    FANOUT_FAIL() << what << ": malformed JSON header: " << e.what();
  }
  if (!ok || !sax.error.empty())
    FANOUT_FAIL() << what << ": " << (sax.error.empty() ? std::string("malformed JSON header") : sax.error);

  Header h;
  h.metadata = std::move(sax.metadata);
  h.entries.reserve(sax.entries.size());
  constexpr uint64_t kI64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  for (RawEntry& r : sax.entries) {
    Entry e;
    e.name = std::move(r.name);
    const std::string tn = "tensor " + quote_name(e.name);
    FANOUT_USER_CHECK(parse_dtype(r.dtype, &e.dtype))
        << what << ": " << tn << " has dtype " << quote_name(r.dtype) << ", which fanout does not support (F32, F64, I32, I64, U8)";
    // Element count as Shape::numel() computes it (left to right) must fit in int64.
    uint64_t numel = 1;
    for (uint64_t d : r.shape) {
      FANOUT_USER_CHECK(d <= kI64Max && !__builtin_mul_overflow(numel, d, &numel) && numel <= kI64Max)
          << what << ": " << tn << " shape " << shape_text(r.shape) << " has more elements than fit in 64 bits";
    }
    uint64_t nbytes = 0;
    FANOUT_USER_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &nbytes))
        << what << ": " << tn << " shape " << shape_text(r.shape) << " has more bytes than fit in 64 bits";
    e.shape.ndim = static_cast<int>(r.shape.size());
    for (size_t i = 0; i < r.shape.size(); ++i) e.shape.d[i] = static_cast<int64_t>(r.shape[i]);

    FANOUT_USER_CHECK(r.offsets.size() == 2 && r.offsets[0] <= r.offsets[1])
        << what << ": " << tn << " data_offsets " << shape_text(r.offsets) << " is not [begin, end] with begin <= end";
    e.begin = r.offsets[0];
    e.end = r.offsets[1];
    FANOUT_USER_CHECK(e.end <= data_size)
        << what << ": " << tn << " data_offsets [" << e.begin << ", " << e.end << "] run past the end of the data ("
        << data_size << " bytes; file truncated?)";
    FANOUT_USER_CHECK(e.end - e.begin == nbytes)
        << what << ": " << tn << " data_offsets [" << e.begin << ", " << e.end << "] hold " << (e.end - e.begin)
        << " bytes but shape " << e.shape.str() << " " << dtype_name(e.dtype) << " needs " << nbytes;
    h.entries.push_back(std::move(e));
  }

  std::stable_sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  const Entry* prev = nullptr;  // the non-empty range ending last so far
  for (const Entry& e : h.entries) {
    if (e.begin == e.end) continue;
    FANOUT_USER_CHECK(!prev || e.begin >= prev->end)
        << what << ": tensors " << quote_name(prev->name) << " [" << prev->begin << ", " << prev->end << ") and "
        << quote_name(e.name) << " [" << e.begin << ", " << e.end << ") overlap in the data buffer";
    if (!prev || e.end > prev->end) prev = &e;
  }
  return h;
}

// Checks the 8-byte prefix of a file of `size` bytes; returns the header length.
uint64_t header_length(const uint8_t prefix[8], uint64_t size, const std::string& what) {
  uint64_t n = 0;
  std::memcpy(&n, prefix, 8);  // little-endian host (asserted above)
  FANOUT_USER_CHECK(n <= kMaxSafetensorsHeader)
      << what << ": header length " << n << " is over the 100 MB limit (not a safetensors file?)";
  FANOUT_USER_CHECK(n <= size - 8) << what << ": header length " << n << " runs past the end of the file (" << size
                                   << " bytes; truncated or not a safetensors file?)";
  return n;
}

void check_min_size(uint64_t size, const std::string& what) {
  FANOUT_USER_CHECK(size >= 8) << what << ": file is " << size
                               << " bytes, too short for a safetensors file (8-byte header length first)";
}

using detail::errno_text;
using detail::Fd;
using detail::pread_all;

// JSON string literal for `s`; throws fanout::Error when s is not valid UTF-8.
std::string json_string(const std::string& s, const std::string& path) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    FANOUT_FAIL() << path << ": tensor name or metadata " << quote_name(s) << " is not valid UTF-8";
  }
}

}  // namespace

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata, StagedFiles* staged) {
  // Header: __metadata__ first, then tensors in the order given, data contiguous.
  std::string hdr = "{";
  if (!metadata.empty()) {
    hdr += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) hdr += ',';
      hdr += json_string(k, path);
      hdr += ':';
      hdr += json_string(v, path);
      first = false;
    }
    hdr += "}";
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    FANOUT_USER_CHECK(name != "__metadata__") << path << ": \"__metadata__\" cannot name a tensor";
    FANOUT_USER_CHECK(seen.insert(name).second) << path << ": tensor name " << quote_name(name) << " appears twice";
    FANOUT_CHECK(t.defined()) << "save_safetensors " << path << ": tensor " << quote_name(name) << " is undefined";
    if (hdr.size() > 1) hdr += ",";
    hdr += json_string(name, path) + ":{\"dtype\":\"" + safetensors_dtype(t.dtype()) + "\",\"shape\":[";
    for (int i = 0; i < t.dim(); ++i) {
      if (i) hdr += ',';
      hdr += std::to_string(t.size(i));
    }
    hdr += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.nbytes()) + "]}";
    offset += t.nbytes();
  }
  hdr += "}";
  hdr.append((8 - hdr.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  FANOUT_USER_CHECK(hdr.size() <= kMaxSafetensorsHeader) << path << ": header over the 100 MB limit";

  const auto produce = [&](const WriteFn& write) {
    const uint64_t n = hdr.size();
    write(&n, 8);
    write(hdr.data(), hdr.size());
    for (const auto& [name, t] : tensors) {
      if (t.nbytes() == 0) continue;
      const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
      write(host.raw(), host.nbytes());
    }
  };
  if (staged) {
    staged->add(path, produce);
  } else {
    write_file_atomic(path, produce);
  }
}

TensorFile parse_safetensors(const uint8_t* data, size_t size, const std::string& what) {
  check_min_size(size, what);
  const uint64_t n = header_length(data, size, what);
  const Header h = parse_header(data + 8, n, size - 8 - n, what);
  const uint8_t* buf = data + 8 + n;
  TensorFile out;
  out.metadata = h.metadata;
  out.tensors.reserve(h.entries.size());
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu());
    if (t.nbytes()) std::memcpy(t.raw(), buf + e.begin, t.nbytes());
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

namespace {

// An open file and its checked header.
struct OpenFile {
  Fd fd{-1};
  uint64_t header_bytes = 0;
  Header header;
};

void read_or_fail(int fd, void* dst, size_t bytes, uint64_t at, const std::string& path) {
  int err = 0;
  FANOUT_USER_CHECK(pread_all(fd, dst, bytes, at, &err))
      << path << ": " << (err ? "read failed: " + errno_text(err) : std::string("file ended early (changed while reading?)"));
}

OpenFile open_safetensors(const std::string& path) {
  OpenFile f;
  Fd& fd = f.fd;
  fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FANOUT_USER_CHECK(fd.fd >= 0) << "cannot open " << path << ": " << errno_text(errno);
  struct stat st {};
  FANOUT_USER_CHECK(::fstat(fd.fd, &st) == 0) << "cannot stat " << path << ": " << errno_text(errno);
  FANOUT_USER_CHECK(S_ISREG(st.st_mode)) << path << ": not a regular file";
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  check_min_size(size, path);

  uint8_t prefix[8];
  read_or_fail(fd.fd, prefix, 8, 0, path);
  const uint64_t n = header_length(prefix, size, path);
  std::vector<uint8_t> hdr(n);
  read_or_fail(fd.fd, hdr.data(), n, 8, path);
  f.header = parse_header(hdr.data(), n, size - 8 - n, path);
  f.header_bytes = n;
  return f;
}

}  // namespace

TensorFile load_safetensors(const std::string& path) {
  OpenFile f = open_safetensors(path);
  TensorFile out;
  out.metadata = f.header.metadata;
  out.tensors.reserve(f.header.entries.size());
  for (const Entry& e : f.header.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu());
    if (t.nbytes()) read_or_fail(f.fd.fd, t.raw(), t.nbytes(), 8 + f.header_bytes + e.begin, path);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  return open_safetensors(path).header.metadata;
}

}  // namespace fanout::io
