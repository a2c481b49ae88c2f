// .npy writer and strict reader. The reader parses the header's dict literal
// itself (the subset of Python literal syntax numpy's repr and hand-written
// headers use) and checks the data size against the shape before reading.
#include "runtime/io/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <system_error>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/io/file_io.h"
#include "runtime/io/safetensors.h"

namespace fanout::io {

static_assert(std::endian::native == std::endian::little, ".npy I/O assumes a little-endian host");

namespace {

constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
// Largest header accepted: fanout's dtypes need a few hundred bytes.
constexpr uint64_t kMaxHeader = uint64_t{1} << 20;

const char* npy_descr(DType t) {
  switch (t) {
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::U8: return "|u1";
    case DType::F16: return "<f2";
    case DType::BF16: break;  // NumPy has no bfloat16
  }
  FANOUT_FAIL() << "no .npy dtype for " << dtype_name(t);
}

std::string quoted(const std::string& s) { return detail::quoted(s, /*escape_non_ascii=*/true); }

using detail::errno_text;
using detail::Fd;
using detail::pread_all;

// The header dict once parsed: {'descr': str, 'fortran_order': bool, 'shape': tuple of int}.
struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<uint64_t> shape;
};

// Parses the header's Python dict literal: string keys and values in single
// or double quotes (no escapes), True / False, tuples of non-negative
// decimal ints ("(3,)" for one dim, "()" for none), optional trailing commas,
// whitespace between tokens. The first deviation is a one-line error.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, bool allow_long_suffix, const std::string& path)
      : s_(text), long_suffix_(allow_long_suffix), path_(path) {}

  Header parse() {
    Header h;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    skip_space();
    expect('{', "does not start with '{'");
    skip_space();
    while (peek() != '}') {
      if (pos_ == s_.size()) fail("ends before its closing '}'");
      const std::string key = string_literal("a key");
      skip_space();
      expect(':', "has no ':' after key " + quoted(key));
      skip_space();
      bool* seen = key == "descr" ? &seen_descr : key == "fortran_order" ? &seen_order : key == "shape" ? &seen_shape : nullptr;
      if (!seen) fail("has the unexpected key " + quoted(key) + " (a .npy header has exactly descr, fortran_order, shape)");
      if (*seen) fail("has the key " + quoted(key) + " twice");
      *seen = true;
      if (key == "descr") {
        if (peek() == '[')
          FANOUT_FAIL() << path_ << ": structured dtype (a list of fields) is not supported; fanout reads plain arrays";
        h.descr = string_literal("descr");
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
      } else {
        h.shape = tuple();
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        if (pos_ == s_.size()) fail("ends before its closing '}'");
        fail("has no ',' or '}' after the value of " + quoted(key));
      }
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != s_.size()) fail("has text after the closing '}'");
    const char* missing = !seen_descr ? "descr" : !seen_order ? "fortran_order" : !seen_shape ? "shape" : nullptr;
    if (missing) fail(std::string("lacks the key '") + missing + "'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    const size_t end = s_.find_last_not_of(" \t\r\n");  // numpy's padding says nothing
    FANOUT_FAIL() << path_ << ": malformed .npy header: it " << what << " (header "
                  << quoted(s_.substr(0, end == std::string::npos ? 0 : end + 1)) << ")";
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect(char c, const std::string& what) {
    if (peek() != c) fail(what);
    ++pos_;
  }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  std::string string_literal(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"') fail(std::string("has no quoted string where ") + what + " should be");
    const size_t begin = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\') fail("has a backslash escape in a string, which .npy headers never need");
      if (s_[pos_] == '\n') fail("has a string that runs past the end of its line");
      ++pos_;
    }
    if (pos_ == s_.size()) fail("has an unterminated string");
    return s_.substr(begin, pos_++ - begin);
  }

  bool boolean() {
    for (const char* word : {"True", "False"}) {
      const size_t n = std::strlen(word);
      if (s_.compare(pos_, n, word) == 0 && !is_name_char(pos_ + n)) {
        pos_ += n;
        return word[0] == 'T';
      }
    }
    fail("has a fortran_order that is not True or False");
  }
  bool is_name_char(size_t i) const {
    if (i >= s_.size()) return false;
    const char c = s_[i];
    return is_digit(c) || c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  }

  std::vector<uint64_t> tuple() {
    expect('(', "has a shape that is not a tuple");
    std::vector<uint64_t> dims;
    skip_space();
    bool trailing_comma = false;
    while (peek() != ')') {
      if (pos_ == s_.size()) fail("ends inside the shape tuple");
      dims.push_back(dim());
      skip_space();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        if (pos_ == s_.size()) fail("ends inside the shape tuple");
        fail("has a shape that is not a tuple of integers");
      }
    }
    ++pos_;  // ')'
    if (dims.size() == 1 && !trailing_comma) fail("has a shape '(n)', which is an int, not a tuple (a 1-d shape is '(n,)')");
    return dims;
  }

  uint64_t dim() {
    if (peek() == '-') fail("has a negative dimension in its shape");
    if (!is_digit(peek())) fail("has a shape that is not a tuple of integers");
    const size_t begin = pos_;
    uint64_t v = 0;
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    while (is_digit(peek())) {
      const uint64_t d = static_cast<uint64_t>(peek() - '0');
      if (v > (kMax - d) / 10) fail("has a dimension that does not fit in 64 bits");
      v = v * 10 + d;
      ++pos_;
    }
    if (s_[begin] == '0' && pos_ - begin > 1) fail("has a dimension with a leading zero");
    if (long_suffix_ && peek() == 'L') ++pos_;  // Python 2's long literal (versions 1.0 and 2.0)
    if (is_name_char(pos_)) fail("has a shape that is not a tuple of integers");
    return v;
  }

  const std::string& s_;
  bool long_suffix_;
  const std::string& path_;
  size_t pos_ = 0;
};

DType parse_descr(const std::string& d, const std::string& path) {
  if (d == "<f4") return DType::F32;
  if (d == "<f8") return DType::F64;
  if (d == "<f2") return DType::F16;
  if (d == "<i4") return DType::I32;
  if (d == "<i8") return DType::I64;
  if (d == "|u1" || d == "<u1") return DType::U8;
  const char* supported = "fanout reads <f4, <f8, <f2, <i4, <i8 and |u1";
  if (!d.empty() && d[0] == '>')
    FANOUT_FAIL() << path << ": dtype " << quoted(d) << " is big-endian; " << supported
                  << " (save arr.astype(arr.dtype.newbyteorder('<')))";
  if (d == "|O" || d == "<O" || d == "O")
    FANOUT_FAIL() << path << ": dtype " << quoted(d) << " is a (pickled) object array; " << supported;
  FANOUT_FAIL() << path << ": dtype " << quoted(d) << " is not supported; " << supported;
}

std::string shape_text(const std::vector<uint64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

}  // namespace

void save_npy(const std::string& path, const Tensor& t) {
  FANOUT_CHECK(t.device().is_cpu()) << "save_npy takes CPU tensors";
  std::string shape;
  for (int i = 0; i < t.dim(); ++i) shape += std::to_string(t.size(i)) + (t.dim() == 1 || i + 1 < t.dim() ? "," : "");
  std::string header = std::string("{'descr': '") + npy_descr(t.dtype()) + "', 'fortran_order': False, 'shape': (" +
                       shape + "), }";
  const size_t prefix = 10;  // magic (6), version (2), header length (2)
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  FANOUT_CHECK(header.size() < 65536) << "npy header too long";
  char head[prefix] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<char>(header.size() & 0xff),
                       static_cast<char>(header.size() >> 8)};
  write_file_atomic(path, [&](const WriteFn& write) {
    write(head, prefix);
    write(header.data(), header.size());
    write(t.raw(), t.nbytes());
  });
}

Tensor load_npy(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  FANOUT_USER_CHECK(fd.fd >= 0) << "cannot open " << path << ": " << errno_text(errno);
  struct stat st {};
  FANOUT_USER_CHECK(::fstat(fd.fd, &st) == 0) << "cannot stat " << path << ": " << errno_text(errno);
  FANOUT_USER_CHECK(!S_ISDIR(st.st_mode)) << path << ": is a directory, not a .npy file";
  FANOUT_USER_CHECK(S_ISREG(st.st_mode)) << path << ": not a regular file";
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  int err = 0;
  auto read_or_fail = [&](void* dst, size_t bytes, uint64_t at) {
    FANOUT_USER_CHECK(pread_all(fd.fd, dst, bytes, at, &err))
        << path << ": " << (err ? "read failed: " + errno_text(err) : std::string("file ended early (changed while reading?)"));
  };

  // Prefix: magic (6), version (2), header length (2 bytes in 1.0, 4 in 2.0 and 3.0).
  uint8_t pre[12] = {};
  FANOUT_USER_CHECK(size >= 10) << path << ": file is " << size << " bytes, too short for a .npy file";
  read_or_fail(pre, 10, 0);
  FANOUT_USER_CHECK(std::memcmp(pre, kMagic, 6) == 0) << path << ": not a .npy file (no \\x93NUMPY magic)";
  const int major = pre[6], minor = pre[7];
  FANOUT_USER_CHECK(minor == 0 && major >= 1 && major <= 3)
      << path << ": .npy format version " << major << "." << minor << " is not supported (1.0, 2.0, 3.0 are)";
  const uint64_t prefix = major == 1 ? 10 : 12;
  FANOUT_USER_CHECK(size >= prefix) << path << ": file is " << size << " bytes, too short for a version " << major
                                    << ".0 .npy prefix";
  if (prefix == 12) read_or_fail(pre + 10, 2, 10);
  const uint64_t header_len = major == 1 ? (uint64_t{pre[8]} | uint64_t{pre[9]} << 8)
                                         : (uint64_t{pre[8]} | uint64_t{pre[9]} << 8 | uint64_t{pre[10]} << 16 |
                                            uint64_t{pre[11]} << 24);
  FANOUT_USER_CHECK(header_len <= kMaxHeader)
      << path << ": .npy header length " << header_len << " is over the " << kMaxHeader << "-byte limit";
  FANOUT_USER_CHECK(header_len <= size - prefix)
      << path << ": .npy header length " << header_len << " runs past the end of the file (" << size
      << " bytes; truncated?)";
  std::string text(header_len, '\0');
  read_or_fail(text.data(), header_len, prefix);

  const Header h = HeaderParser(text, major <= 2, path).parse();
  const DType dtype = parse_descr(h.descr, path);
  FANOUT_USER_CHECK(!h.fortran_order)
      << path << ": fortran_order is True; fanout reads C-order arrays (save np.ascontiguousarray(arr))";
  FANOUT_USER_CHECK(h.shape.size() <= static_cast<size_t>(Shape::kMaxDims))
      << path << ": shape " << shape_text(h.shape) << " has " << h.shape.size() << " dims; fanout tensors have at most "
      << Shape::kMaxDims;
  // Element count as Shape::numel() computes it (left to right) must fit in int64; bytes in uint64.
  constexpr uint64_t kI64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t numel = 1, nbytes = 0;
  for (uint64_t d : h.shape)
    FANOUT_USER_CHECK(!__builtin_mul_overflow(numel, d, &numel) && numel <= kI64Max)
        << path << ": shape " << shape_text(h.shape) << " has more elements than fit in 64 bits";
  FANOUT_USER_CHECK(!__builtin_mul_overflow(numel, uint64_t{dtype_size(dtype)}, &nbytes))
      << path << ": shape " << shape_text(h.shape) << " has more bytes than fit in 64 bits";
  const uint64_t held = size - prefix - header_len;
  FANOUT_USER_CHECK(held >= nbytes) << path << ": truncated: shape " << shape_text(h.shape) << " " << dtype_name(dtype)
                                    << " needs " << nbytes << " bytes of data but the file holds " << held;
  FANOUT_USER_CHECK(held == nbytes) << path << ": holds " << held - nbytes << " bytes after the data that shape "
                                    << shape_text(h.shape) << " " << dtype_name(dtype) << " needs (" << nbytes
                                    << " bytes)";

  Shape shape;
  shape.ndim = static_cast<int>(h.shape.size());
  for (int i = 0; i < shape.ndim; ++i) shape.d[i] = static_cast<int64_t>(h.shape[i]);
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  if (nbytes) read_or_fail(t.raw(), nbytes, prefix + header_len);
  return t;
}

}  // namespace fanout::io
