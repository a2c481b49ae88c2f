// .npy files: save_npy / load_npy round trips for every dtype, the header
// variants numpy writes (versions 1.0, 2.0, 3.0, any key order), and one
// one-line fanout::Error naming the file for every kind of malformed file,
// built byte by byte.
#include "runtime/io/npy.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "io/temp_dir.h"
#include "support/test_util.h"

namespace fanout::io {
namespace {

namespace fs = std::filesystem;
using testing::expect_user_error;

// Directories named fanout_npy_*.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("fanout_npy_") {}
};

void write_bytes(const std::string& path, const std::string& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A file image: magic, version major.0, the header length (2 bytes in 1.0,
// 4 otherwise; the header's own length unless given), the header, the data.
std::string npy_image(int major, const std::string& header, const std::string& data, int64_t length = -1) {
  const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  std::string s = "\x93NUMPY";
  s += static_cast<char>(major);
  s += '\0';
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) s += static_cast<char>((n >> (8 * i)) & 0xff);
  return s + header + data;
}

// A header dict as numpy writes it (padded to 64 bytes for version 1.0).
std::string numpy_header(const std::string& descr, const std::string& shape, const std::string& order = "False") {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }";
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  return h + "\n";
}

Tensor random_of(DType t, const Shape& s, std::mt19937_64& rng) {
  Tensor x = Tensor::empty(s, t);
  auto* p = static_cast<uint8_t*>(x.raw());
  for (size_t i = 0; i < x.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  if (t == DType::F32 && x.numel() > 0) x.data<float>()[0] = -0.0f;  // a signed zero survives
  return x;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// Loading `bytes` written to `name` fails with one line naming the file and holding every part.
void expect_bad(const TempDir& dir, const std::string& name, const std::string& bytes,
                std::vector<std::string> parts) {
  const std::string path = dir.file(name);
  write_bytes(path, bytes);
  parts.push_back(path);
  expect_user_error([&] { load_npy(path); }, parts);
}

TEST(Npy, RoundTripEveryDtypeAndShape) {
  TempDir dir;
  std::mt19937_64 rng(1);
  const std::vector<Shape> shapes = {Shape{}, Shape{0}, Shape{7}, Shape{3, 4}, Shape{2, 0, 3}, Shape{1, 2, 3, 2, 2}};
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::I32, DType::I64, DType::U8}) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + s.str());
      const Tensor x = random_of(t, s, rng);
      save_npy(dir.file("x.npy"), x);
      const Tensor y = load_npy(dir.file("x.npy"));
      EXPECT_EQ(y.dtype(), t);
      EXPECT_EQ(y.shape(), s);
      EXPECT_TRUE(y.device().is_cpu());
      EXPECT_TRUE(same_bytes(x, y));
    }
  }
}

TEST(Npy, ScalarIsZeroDimensional) {
  TempDir dir;
  write_bytes(dir.file("s.npy"), npy_image(1, numpy_header("<f8", "()"), std::string("\0\0\0\0\0\0\xf8\x3f", 8)));
  const Tensor t = load_npy(dir.file("s.npy"));
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.data<double>()[0], 1.5);
}

TEST(Npy, ReadsVersions2And3AndHeaderVariants) {
  TempDir dir;
  const std::string data = std::string("\x01\x00\x00\x00\x02\x00\x00\x00\xff\xff\xff\xff", 12);  // int32 1, 2, -1
  const std::vector<std::pair<int, std::string>> cases = {
      {2, numpy_header("<i4", "(3,)")},
      {3, numpy_header("<i4", "(3,)")},
      {1, "{'shape': (3,), 'descr': '<i4', 'fortran_order': False}"},              // any order, no padding
      {1, "{\"descr\":\"<i4\",\"fortran_order\":False,\"shape\":(3,)}\n"},         // double quotes, no spaces
      {1, "  {\n 'descr' : '<i4' ,\n\t'fortran_order':False,'shape':( 3 , ),}  \n"},  // whitespace anywhere
      {1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3L,), }\n"},         // Python 2's long
      {2, "{'descr': '<i4', 'fortran_order': False, 'shape': (3L,), }\n"},
  };
  for (const auto& [major, header] : cases) {
    SCOPED_TRACE(std::to_string(major) + ".0 " + header);
    write_bytes(dir.file("v.npy"), npy_image(major, header, data));
    const Tensor t = load_npy(dir.file("v.npy"));
    ASSERT_EQ(t.shape(), Shape{3});
    ASSERT_EQ(t.dtype(), DType::I32);
    EXPECT_EQ(t.data<int32_t>()[0], 1);
    EXPECT_EQ(t.data<int32_t>()[1], 2);
    EXPECT_EQ(t.data<int32_t>()[2], -1);
  }
  // Bytes with '<u1' (what np.dtype('<u1').str spells '|u1'), and 5 dims.
  write_bytes(dir.file("u.npy"), npy_image(1, numpy_header("<u1", "(1, 1, 1, 1, 2)"), "\x07\x09"));
  const Tensor u = load_npy(dir.file("u.npy"));
  EXPECT_EQ(u.shape(), (Shape{1, 1, 1, 1, 2}));
  EXPECT_EQ(u.data<uint8_t>()[1], 9);
}

TEST(NpyMalformed, NotARegularFile) {
  TempDir dir;
  expect_user_error([&] { load_npy(dir.file("missing.npy")); }, {"cannot open", dir.file("missing.npy"), "No such file"});
  expect_user_error([&] { load_npy(dir.path.string()); }, {dir.path.string(), "is a directory"});
  const std::string fifo = dir.file("fifo.npy");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_user_error([&] { load_npy(fifo); }, {fifo, "not a regular file"});  // and does not block
}

TEST(NpyMalformed, PrefixMagicAndVersion) {
  TempDir dir;
  const std::string h = numpy_header("<f4", "(1,)"), d(4, '\0');
  expect_bad(dir, "empty.npy", "", {"0 bytes, too short"});
  expect_bad(dir, "short.npy", "\x93NUMPY\x01", {"7 bytes, too short"});
  expect_bad(dir, "magic.npy", "PK\x03\x04" + std::string(60, '\0'), {"not a .npy file"});
  expect_bad(dir, "v4.npy", npy_image(4, h, d), {"version 4.0 is not supported"});
  std::string v11 = npy_image(1, h, d);
  v11[7] = 1;
  expect_bad(dir, "v11.npy", v11, {"version 1.1 is not supported"});
  expect_bad(dir, "v2short.npy", std::string("\x93NUMPY\x02\x00\x10\x00", 10), {"too short for a version 2.0"});
  expect_bad(dir, "hlen.npy", npy_image(1, h, d, 1000), {"header length 1000 runs past the end"});
  expect_bad(dir, "hbig.npy", npy_image(2, h, d, 0x7fffffff), {"header length 2147483647 is over the"});
}

TEST(NpyMalformed, HeaderSyntax) {
  TempDir dir;
  const std::string d(4, '\0');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "does not start with '{'"},
      {"", "does not start with '{'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", "ends before its closing '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", "text after the closing '}'"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", "no ',' or '}' after the value of 'descr'"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': (1,)}", "no ':' after key 'descr'"},
      {"{descr: '<f4', 'fortran_order': False, 'shape': (1,)}", "no quoted string where a key should be"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}", "no ',' or '}' after the value of 'descr'"},
      {"{'descr': '<f4\n', 'fortran_order': False, 'shape': (1,)}", "runs past the end of its line"},
      {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}", "backslash escape"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", "unexpected key 'x'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", "key 'descr' twice"},
      {"{'descr': '<f4', 'shape': (1,)}", "lacks the key 'fortran_order'"},
      {"{'fortran_order': False, 'shape': (1,)}", "lacks the key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False}", "lacks the key 'shape'"},
      {"{'descr': 4, 'fortran_order': False, 'shape': (1,)}", "no quoted string where descr should be"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", "not True or False"},
      {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (1,)}", "not True or False"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", "shape that is not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1)}", "which is an int, not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1.0,)}", "not a tuple of integers"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1 1)}", "not a tuple of integers"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", "not a tuple of integers"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (01,)}", "leading zero"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1", "ends inside the shape tuple"},
  };
  for (const auto& [header, needle] : cases) {
    SCOPED_TRACE(header);
    expect_bad(dir, "h.npy", npy_image(1, header, d), {"malformed .npy header", needle});
  }
  // Python 2's 'L' suffix only in versions 1.0 and 2.0, as numpy.
  expect_bad(dir, "l3.npy", npy_image(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (1L,)}", d),
             {"not a tuple of integers"});
}

TEST(NpyMalformed, DtypesAndOrder) {
  TempDir dir;
  const std::string d(8, '\0');
  expect_bad(dir, "be.npy", npy_image(1, numpy_header(">f4", "(2,)"), d), {"'>f4' is big-endian"});
  expect_bad(dir, "be8.npy", npy_image(1, numpy_header(">i8", "(1,)"), d), {"'>i8' is big-endian"});
  expect_bad(dir, "obj.npy", npy_image(1, numpy_header("|O", "(1,)"), d), {"'|O' is a (pickled) object array"});
  for (const char* descr : {"<c8", "|b1", "|i1", "<u4", "<U3", "|V8", "f4", "=f4", ""}) {
    SCOPED_TRACE(descr);
    expect_bad(dir, "dt.npy", npy_image(1, numpy_header(descr, "(1,)"), d),
               {std::string("'") + descr + "' is not supported", "<f4, <f8, <f2, <i4, <i8 and |u1"});
  }
  expect_bad(dir, "st.npy", npy_image(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", d),
             {"structured dtype (a list of fields) is not supported"});
  expect_bad(dir, "f.npy", npy_image(1, numpy_header("<f4", "(1, 2)", "True"), d), {"fortran_order is True"});
}

TEST(NpyMalformed, ShapesAndDataSize) {
  TempDir dir;
  const std::string h12 = numpy_header("<f4", "(1, 2)");
  expect_bad(dir, "neg.npy", npy_image(1, numpy_header("<f4", "(-1,)"), ""), {"negative dimension"});
  expect_bad(dir, "big.npy", npy_image(1, numpy_header("<f4", "(99999999999999999999,)"), ""),
             {"does not fit in 64 bits"});
  expect_bad(dir, "i64max.npy", npy_image(1, numpy_header("<f4", "(9223372036854775808,)"), ""),
             {"does not fit in 64 bits"});
  expect_bad(dir, "numel.npy", npy_image(1, numpy_header("<f4", "(4294967296, 4294967296)"), ""),
             {"more elements than fit in 64 bits"});
  expect_bad(dir, "bytes.npy", npy_image(1, numpy_header("<f8", "(4611686018427387904,)"), ""),
             {"more bytes than fit in 64 bits"});
  expect_bad(dir, "six.npy", npy_image(1, numpy_header("<f4", "(1, 1, 1, 1, 1, 1)"), std::string(4, '\0')),
             {"has 6 dims", "at most 5"});
  expect_bad(dir, "short.npy", npy_image(1, h12, std::string(7, '\0')),
             {"truncated", "(1, 2) float32 needs 8 bytes of data but the file holds 7"});
  expect_bad(dir, "nodata.npy", npy_image(1, h12, ""), {"truncated", "holds 0"});
  expect_bad(dir, "long.npy", npy_image(1, h12, std::string(9, '\0')), {"holds 1 bytes after the data"});
  expect_bad(dir, "zero.npy", npy_image(1, numpy_header("<f4", "(0, 3)"), std::string(4, '\0')),
             {"holds 4 bytes after the data", "(0, 3)"});
  // A huge claimed shape is a size mismatch, not an allocation.
  expect_bad(dir, "huge.npy", npy_image(1, numpy_header("<f4", "(1000000000000,)"), std::string(4, '\0')),
             {"truncated", "needs 4000000000000 bytes"});
}

// Every proper prefix of a valid file, and many single-byte corruptions,
// either load or throw fanout::Error (one line).
TEST(NpyMalformed, TruncationsAndBitFlipsNeverCrash) {
  TempDir dir;
  std::mt19937_64 rng(3);
  save_npy(dir.file("good.npy"), random_of(DType::F32, Shape{3, 5}, rng));
  const std::string good = read_bytes(dir.file("good.npy"));
  const std::string path = dir.file("bad.npy");
  for (size_t n = 0; n < good.size(); ++n) {
    write_bytes(path, good.substr(0, n));
    expect_user_error([&] { load_npy(path); }, {path});
  }
  int loaded = 0;
  for (int i = 0; i < 400; ++i) {
    std::string b = good;
    b[rng() % 128] ^= static_cast<char>(1u << (rng() % 8));  // prefix and header
    write_bytes(path, b);
    try {
      load_npy(path);
      ++loaded;  // a flip in the padding, say
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_LT(loaded, 400);
}

}  // namespace
}  // namespace fanout::io
