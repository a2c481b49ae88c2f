// safetensors files: round trip, layout, atomic writes, and one fanout::Error
// (never a crash) for every kind of malformed file, built byte by byte.
#include "runtime/io/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "runtime/core/error.h"
#include "runtime/io/file_io.h"
#include "io/temp_dir.h"
#include "support/test_util.h"

namespace fanout::io {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

Tensor random_of(DType t, const Shape& s, std::mt19937_64& rng) {
  if (t == DType::F32) return testing::random_tensor(s, rng);
  Tensor x = Tensor::empty(s, t);
  auto* p = static_cast<uint8_t*>(x.raw());
  for (size_t i = 0; i < x.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return x;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

std::vector<std::pair<std::string, Tensor>> sample_tensors(std::mt19937_64& rng) {
  return {
      {"conv1.weight", random_of(DType::F32, Shape{4, 3, 3, 3}, rng)},
      {"bn1.num_batches_tracked", random_of(DType::I64, Shape{}, rng)},  // scalar
      {"labels", random_of(DType::I32, Shape{7}, rng)},
      {"pixels", random_of(DType::U8, Shape{2, 5, 3}, rng)},  // 30 bytes: later data unaligned
      {"fc.weight", random_of(DType::F32, Shape{10, 12}, rng)},
      {"empty", random_of(DType::F32, Shape{0, 3}, rng)},
      {"vol", random_of(DType::F32, Shape{1, 2, 3, 2, 2}, rng)},  // 5 dims
      {"caf\xc3\xa9.bias", random_of(DType::F32, Shape{3}, rng)},  // UTF-8 name
  };
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A file image: `n` as the 8-byte length (the header's own length by default),
// then the header text, then `data`.
std::vector<uint8_t> image(const std::string& header, const std::string& data = "",
                           uint64_t n = std::numeric_limits<uint64_t>::max()) {
  if (n == std::numeric_limits<uint64_t>::max()) n = header.size();
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  s += header;
  s += data;
  return {s.begin(), s.end()};
}

// Parsing must throw fanout::Error naming the input and containing `needle`.
void expect_bad(const std::vector<uint8_t>& bytes, const std::string& needle) {
  try {
    parse_safetensors(bytes.data(), bytes.size(), "ckpt.safetensors");
    ADD_FAILURE() << "no error; expected one containing \"" << needle << "\"";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ckpt.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "expected \"" << needle << "\" in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}
void expect_bad(const std::string& header, const std::string& data, const std::string& needle) {
  expect_bad(image(header, data), needle);
}

// One valid F32 tensor entry.
std::string entry(const std::string& name, const std::string& shape, uint64_t b, uint64_t e,
                  const std::string& dtype = "F32") {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

TEST(Safetensors, RoundTripIsBitExact) {
  TempDir dir;
  std::mt19937_64 rng(1);
  auto tensors = sample_tensors(rng);
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"epoch", "3"}, {"note", "\xe2\x9c\x93 \"quoted\"\n"}};
  save_safetensors(dir.file("a.safetensors"), tensors, meta);

  TensorFile f = load_safetensors(dir.file("a.safetensors"));
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(tensors[i].first);
    EXPECT_EQ(f.tensors[i].first, tensors[i].first);  // file order is the order given
    EXPECT_EQ(f.tensors[i].second.shape(), tensors[i].second.shape());
    EXPECT_EQ(f.tensors[i].second.dtype(), tensors[i].second.dtype());
    EXPECT_TRUE(f.tensors[i].second.device().is_cpu());
    EXPECT_TRUE(same_bytes(f.tensors[i].second, tensors[i].second));
  }
  EXPECT_EQ(f.tensors[1].second.dim(), 0);
  EXPECT_EQ(f.tensors[1].second.numel(), 1);

  // The in-memory parser sees the same thing.
  const auto bytes = read_bytes(dir.file("a.safetensors"));
  TensorFile g = parse_safetensors(bytes.data(), bytes.size(), "a");
  ASSERT_EQ(g.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_TRUE(same_bytes(g.tensors[i].second, tensors[i].second));
}

// bfloat16 and float16 tensors (what torch saves for low-precision models)
// keep their type, shape and bytes.
TEST(Safetensors, LowPrecisionTensorsRoundTrip) {
  TempDir dir;
  std::mt19937_64 rng(2);
  const std::vector<std::pair<std::string, Tensor>> tensors = {{"w16", random_of(DType::F16, Shape{3, 5}, rng)},
                                                               {"wbf", random_of(DType::BF16, Shape{7}, rng)}};
  save_safetensors(dir.file("h.safetensors"), tensors, {});
  const auto bytes = read_bytes(dir.file("h.safetensors"));
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_NE(text.find("\"dtype\":\"F16\""), std::string::npos);
  EXPECT_NE(text.find("\"dtype\":\"BF16\""), std::string::npos);
  TensorFile f = load_safetensors(dir.file("h.safetensors"));
  ASSERT_EQ(f.tensors.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(f.tensors[i].second.dtype(), tensors[i].second.dtype());
    EXPECT_EQ(f.tensors[i].second.shape(), tensors[i].second.shape());
    EXPECT_TRUE(same_bytes(f.tensors[i].second, tensors[i].second));
  }
}

TEST(Safetensors, LayoutMatchesTheReference) {
  TempDir dir;
  std::mt19937_64 rng(2);
  auto tensors = sample_tensors(rng);
  save_safetensors(dir.file("a.safetensors"), tensors, {{"k", "v"}});
  const auto bytes = read_bytes(dir.file("a.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header padded so the data starts 8-byte aligned";
  size_t data = 0;
  for (auto& [name, t] : tensors) data += t.nbytes();
  EXPECT_EQ(bytes.size(), 8 + n + data) << "data contiguous, nothing after it";
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"k\":\"v\"}", 0), 0u) << header;
  EXPECT_NE(header.find("\"shape\":[]"), std::string::npos) << "scalar shape";
  const size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(n - last - 1, 8u);
}

TEST(Safetensors, EmptyMetadataAndNoTensors) {
  TempDir dir;
  save_safetensors(dir.file("e.safetensors"), {}, {});
  TensorFile f = load_safetensors(dir.file("e.safetensors"));
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
}

TEST(Safetensors, OverwritesAnExistingFile) {
  TempDir dir;
  std::mt19937_64 rng(3);
  const std::string path = dir.file("c.safetensors");
  save_safetensors(path, {{"a", testing::random_tensor(Shape{5}, rng)}});
  Tensor b = testing::random_tensor(Shape{2, 2}, rng);
  save_safetensors(path, {{"b", b}});
  TensorFile f = load_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].first, "b");
  EXPECT_TRUE(same_bytes(f.tensors[0].second, b));
  EXPECT_TRUE(dir.leftovers({"c.safetensors"}).empty());
}

// Through a symbolic link the link stays and its target is replaced; an
// existing file keeps its permissions (the write goes to a temporary renamed
// over it, named apart from any other process's, even one with this pid).
TEST(Safetensors, WritesThroughALinkAndKeepsPermissions) {
  TempDir dir;
  std::mt19937_64 rng(5);
  const std::string target = dir.file("real.safetensors"), link = dir.file("link.safetensors");
  save_safetensors(target, {{"a", testing::random_tensor(Shape{3}, rng)}});
  ASSERT_EQ(::chmod(target.c_str(), 0600), 0);
  std::filesystem::create_symlink("real.safetensors", link);
  // What another process with this pid left mid-write (the old temporary name): not touched.
  const std::string other = target + ".tmp." + std::to_string(::getpid());
  std::ofstream(other) << "another writer's bytes";
  Tensor b = testing::random_tensor(Shape{2}, rng);
  save_safetensors(link, {{"b", b}});
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_TRUE(same_bytes(load_safetensors(target).tensors.at(0).second, b));
  struct stat st{};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  std::ifstream in(other);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "another writer's bytes");
  const std::string old_name = "real.safetensors.tmp." + std::to_string(::getpid());
  EXPECT_TRUE(dir.leftovers({"real.safetensors", "link.safetensors", old_name}).empty());
  // A link to a file not written yet (through a second link): the links stay, the file is made.
  std::filesystem::create_symlink("new.safetensors", dir.file("first.safetensors"));
  std::filesystem::create_symlink("first.safetensors", dir.file("second.safetensors"));
  save_safetensors(dir.file("second.safetensors"), {{"b", b}});
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("second.safetensors")));
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("first.safetensors")));
  EXPECT_TRUE(same_bytes(load_safetensors(dir.file("new.safetensors")).tensors.at(0).second, b));
}

TEST(Safetensors, FailedWriteLeavesThePreviousFileAndNoTemporary) {
  TempDir dir;
  std::mt19937_64 rng(4);
  const std::string path = dir.file("ckpt.safetensors");
  Tensor a = testing::random_tensor(Shape{64}, rng);
  save_safetensors(path, {{"a", a}}, {{"step", "1"}});
  const auto before = read_bytes(path);

  // The second tensor cannot be copied to the host (no such device): the
  // write fails after the header and the first tensor went to the temp file.
  float host[4] = {1, 2, 3, 4};
  Tensor bad = Tensor::wrap(host, Shape{4}, DType::F32, Device::cuda(99));
  EXPECT_THROW(save_safetensors(path, {{"a", testing::random_tensor(Shape{64}, rng)}, {"bad", bad}}, {{"step", "2"}}),
               Error);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_TRUE(dir.leftovers({"ckpt.safetensors"}).empty()) << dir.leftovers({"ckpt.safetensors"})[0];
  TensorFile f = load_safetensors(path);
  EXPECT_EQ(f.metadata.at("step"), "1");
  EXPECT_TRUE(same_bytes(f.tensors.at(0).second, a));
}

// Files replaced together: none changes before commit(), a failed add leaves every path as it was, and
// the error names the file being written, not its temporary.
TEST(StagedFiles, ReplaceEveryFileOrNone) {
  TempDir dir;
  const std::string a = dir.file("a.json"), b = dir.file("b.json");
  io::write_file_atomic(a, "old a");
  {
    io::StagedFiles files;
    files.add(a, "new a");
    files.add(b, "new b");
    EXPECT_EQ(read_bytes(a), std::vector<uint8_t>({'o', 'l', 'd', ' ', 'a'}));
    EXPECT_FALSE(std::filesystem::exists(b));
  }  // destroyed before commit
  EXPECT_EQ(read_bytes(a), std::vector<uint8_t>({'o', 'l', 'd', ' ', 'a'}));
  EXPECT_FALSE(std::filesystem::exists(b));
  EXPECT_TRUE(dir.leftovers({"a.json"}).empty()) << dir.leftovers({"a.json"})[0];
  io::StagedFiles files;
  files.add(a, "new a");
  const std::string missing = dir.file("none/c.json");
  const std::string e = testing::error_of([&] { files.add(missing, "c"); });
  EXPECT_EQ(e.rfind("cannot write " + missing + ": cannot create " + missing + ".tmp.", 0), 0u) << e;
  EXPECT_NE(e.find(": No such file or directory"), std::string::npos) << e;
  files.add(b, "new b");
  files.commit();
  EXPECT_EQ(read_bytes(a), std::vector<uint8_t>({'n', 'e', 'w', ' ', 'a'}));
  EXPECT_EQ(read_bytes(b), std::vector<uint8_t>({'n', 'e', 'w', ' ', 'b'}));
  EXPECT_TRUE(dir.leftovers({"a.json", "b.json"}).empty());
}

// A header check alone: a file cut short is refused as load_safetensors refuses it.
TEST(Safetensors, MetadataIsReadFromTheHeaderOfAWholeFile) {
  TempDir dir;
  std::mt19937_64 rng(6);
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"a", testing::random_tensor(Shape{64}, rng)}}, {{"epoch", "3"}});
  EXPECT_EQ(read_safetensors_metadata(path).at("epoch"), "3");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);
  const std::string e = testing::error_of([&] { read_safetensors_metadata(path); });
  EXPECT_EQ(e, testing::error_of([&] { load_safetensors(path); }));
  EXPECT_NE(e.find("run past the end of the data"), std::string::npos) << e;
}

TEST(Safetensors, MissingDirectoryIsAnErrorAndCreatesNothing) {
  TempDir dir;
  std::mt19937_64 rng(5);
  const std::string path = dir.file("no/such/dir/x.safetensors");
  try {
    save_safetensors(path, {{"a", testing::random_tensor(Shape{3}, rng)}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(dir.leftovers({}).empty());
}

TEST(Safetensors, SaveRejectsBadNames) {
  TempDir dir;
  std::mt19937_64 rng(6);
  Tensor t = testing::random_tensor(Shape{3}, rng);
  EXPECT_THROW(save_safetensors(dir.file("x"), {{"a", t}, {"a", t}}), Error);
  EXPECT_THROW(save_safetensors(dir.file("x"), {{"__metadata__", t}}), Error);
  EXPECT_THROW(save_safetensors(dir.file("x"), {{"bad\xff", t}}), Error);  // not UTF-8
  EXPECT_THROW(save_safetensors(dir.file("x"), {{"a", t}}, {{"k", "\xc3"}}), Error);
  EXPECT_TRUE(dir.leftovers({}).empty());
}

TEST(Safetensors, LoadErrorsNameTheFile) {
  TempDir dir;
  const std::string missing = dir.file("missing.safetensors");
  try {
    load_safetensors(missing);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_safetensors(dir.path.string()), Error);  // a directory

  // A truncated checkpoint read from disk.
  std::mt19937_64 rng(7);
  save_safetensors(dir.file("t.safetensors"), {{"w", testing::random_tensor(Shape{100}, rng)}});
  auto bytes = read_bytes(dir.file("t.safetensors"));
  for (size_t keep : {size_t{0}, size_t{5}, size_t{20}, bytes.size() - 1}) {
    write_bytes(dir.file("t2.safetensors"), std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(keep)));
    try {
      load_safetensors(dir.file("t2.safetensors"));
      ADD_FAILURE() << "no error for " << keep << " bytes";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("t2.safetensors"), std::string::npos) << e.what();
    }
  }
}

TEST(Safetensors, AcceptsPaddingScalarsEmptyTensorsAndUnknownKeys) {
  float v[3] = {1.5f, -2.0f, 3.25f};
  int64_t s = -7;
  std::string data(reinterpret_cast<char*>(v), 12);
  data.append(reinterpret_cast<char*>(&s), 8);
  const std::string header = "{" + entry("s", "[]", 12, 20, "I64") + "," + entry("v", "[3]", 0, 12) + "," +
                             entry("z", "[2, 0, 4]", 20, 20) +
                             ",\"u\":{\"extra\":{\"deep\":[[1,{\"x\":null}]]},\"dtype\":\"U8\",\"shape\":[0],"
                             "\"data_offsets\":[5,5]}} \n\t   ";
  auto bytes = image(header, data);
  TensorFile f = parse_safetensors(bytes.data(), bytes.size(), "t");
  ASSERT_EQ(f.tensors.size(), 4u);
  // Sorted by data offset, header order among equals.
  EXPECT_EQ(f.tensors[0].first, "v");
  EXPECT_EQ(f.tensors[1].first, "u");
  EXPECT_EQ(f.tensors[2].first, "s");
  EXPECT_EQ(f.tensors[3].first, "z");
  EXPECT_EQ(f.tensors[0].second.f32()[2], 3.25f);
  EXPECT_EQ(f.tensors[2].second.dim(), 0);
  EXPECT_EQ(f.tensors[2].second.data<int64_t>()[0], -7);
  EXPECT_EQ(f.tensors[3].second.shape(), (Shape{2, 0, 4}));
  EXPECT_TRUE(f.metadata.empty());
}

TEST(SafetensorsMalformed, TooShortOrBadHeaderLength) {
  for (size_t n : {0, 1, 7}) expect_bad(std::vector<uint8_t>(n, 0), "too short");
  expect_bad(image("{}", "", 100), "past the end of the file");
  expect_bad(image("{}", "", 9), "past the end of the file");
  expect_bad(image("{}", "", 100'000'001), "100 MB");
  expect_bad(image("{}", "", std::numeric_limits<uint64_t>::max() - 1), "100 MB");
  expect_bad(image("", ""), "malformed JSON");  // zero-length header
}

TEST(SafetensorsMalformed, BadJson) {
  expect_bad("{\"a\": ", "", "malformed JSON");
  expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", std::string(4, '\0'),
             "malformed JSON");
  expect_bad("{} x", "", "malformed JSON");
  expect_bad("{\"\xff\":1}", "", "malformed JSON");  // invalid UTF-8
  expect_bad(std::string("{\0}", 3), "", "malformed JSON");
  expect_bad("{/* c */}", "", "malformed JSON");
}

TEST(SafetensorsMalformed, HeaderNotAnObject) {
  for (const char* h : {"[]", "[{}]", "\"x\"", "3", "null", "true", "-1.5"}) expect_bad(h, "", "not a JSON object");
}

TEST(SafetensorsMalformed, EntryNotAnObjectOrMissingKeys) {
  expect_bad("{\"w\": 3}", "", "entry 'w' is not an object");
  expect_bad("{\"w\": [1, 2]}", "", "entry 'w' is not an object");
  expect_bad("{\"w\": \"F32\"}", "", "entry 'w' is not an object");
  expect_bad("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, 0), "has no \"dtype\"");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", std::string(4, 0), "has no \"shape\"");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", std::string(4, 0), "has no \"data_offsets\"");
  expect_bad("{\"w\":{}}", "", "has no");
}

TEST(SafetensorsMalformed, Dtype) {
  expect_bad("{" + entry("w", "[4]", 0, 4, "F8_E4M3") + "}", std::string(4, 0), "'F8_E4M3'");
  expect_bad("{" + entry("w", "[2]", 0, 2, "BOOL") + "}", std::string(2, 0), "'BOOL'");
  expect_bad("{" + entry("w", "[1]", 0, 4, "f32") + "}", std::string(4, 0), "'f32'");
  expect_bad("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, 0), "not a string");
  expect_bad("{\"w\":{\"dtype\":[\"F32\"],\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, 0), "not a string");
}

TEST(SafetensorsMalformed, Shape) {
  const std::string d(64, 0);
  const char* not_list = "not a list of non-negative integers";
  for (const char* s : {"3", "\"3\"", "{}", "[-1]", "[1.5]", "[1e2]", "[\"2\"]", "[[2]]", "[null]", "[true]", "[{}]"})
    expect_bad("{" + entry("w", s, 0, 4) + "}", d, not_list);
  expect_bad("{" + entry("w", "[1,1,1,1,1,1]", 0, 4) + "}", d, "more than 5 dims");
  expect_bad("{" + entry("w", "[4294967296,4294967296]", 0, 4) + "}", d, "64 bits");
  expect_bad("{" + entry("w", "[4294967296,4294967296,0]", 0, 0) + "}", d, "64 bits");
  expect_bad("{" + entry("w", "[18446744073709551615]", 0, 4) + "}", d, "64 bits");
  expect_bad("{" + entry("w", "[9223372036854775807]", 0, 4) + "}", d, "64 bits");  // * 4 bytes
  expect_bad("{" + entry("w", "[99999999999999999999999]", 0, 4) + "}", d, not_list);  // parsed as a float
  // 0 in front keeps the running product at 0, as Shape::numel() computes it.
  auto ok = image("{" + entry("w", "[0,4294967296,4294967296]", 0, 0) + "}");
  EXPECT_EQ(parse_safetensors(ok.data(), ok.size(), "t").tensors.at(0).second.numel(), 0);
}

TEST(SafetensorsMalformed, DataOffsets) {
  const std::string d(16, 0);
  auto with = [](const std::string& offs) {
    return "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":" + offs + "}}";
  };
  for (const char* o : {"4", "[]", "[0]", "[0,4,8]", "[-1,3]", "[0,4.0]", "[\"0\",\"4\"]", "{}", "[[0],[4]]"})
    expect_bad(with(o), d, "data_offsets");
  expect_bad(with("[8,4]"), d, "begin <= end");
  expect_bad(with("[16,20]"), d, "past the end of the data");
  expect_bad(with("[0,18446744073709551615]"), d, "past the end of the data");
  expect_bad(with("[0,8]"), d, "hold 8 bytes but shape (1) float32 needs 4");
  expect_bad(with("[0,0]"), d, "needs 4");
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  const std::string d(16, 0);
  expect_bad("{" + entry("a", "[2]", 0, 8) + "," + entry("b", "[2]", 4, 12) + "}", d, "overlap");
  expect_bad("{" + entry("a", "[2]", 4, 12) + "," + entry("b", "[2]", 0, 8) + "}", d, "overlap");
  expect_bad("{" + entry("a", "[4]", 0, 16) + "," + entry("b", "[1]", 4, 8) + "}", d, "overlap");  // inside
  expect_bad("{" + entry("a", "[2]", 0, 8) + "," + entry("b", "[2]", 0, 8) + "}", d, "overlap");   // same
  // Three ranges, the overlap being between the first and the third.
  expect_bad("{" + entry("a", "[4]", 0, 16) + "," + entry("b", "[0]", 8, 8) + "," + entry("c", "[1]", 12, 16) + "}",
             d, "overlap");
  // Touching ranges and empty tensors inside others are fine.
  auto ok = image("{" + entry("a", "[2]", 0, 8) + "," + entry("b", "[2]", 8, 16) + "," + entry("c", "[0]", 4, 4) + "}",
                  d);
  EXPECT_EQ(parse_safetensors(ok.data(), ok.size(), "t").tensors.size(), 3u);
}

TEST(SafetensorsMalformed, DuplicateNamesAndKeys) {
  const std::string d(8, 0);
  expect_bad("{" + entry("a", "[1]", 0, 4) + "," + entry("a", "[1]", 4, 8) + "}", d, "'a' appears twice");
  expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", "", "appears twice");
  expect_bad("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d,
             "\"dtype\" twice");
  expect_bad("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", "", "'k' appears twice");
}

TEST(SafetensorsMalformed, Metadata) {
  expect_bad("{\"__metadata__\":{\"k\":1}}", "", "value of 'k' is not a string");
  expect_bad("{\"__metadata__\":{\"k\":null}}", "", "not a string");
  expect_bad("{\"__metadata__\":{\"k\":{\"a\":\"b\"}}}", "", "not a string");
  expect_bad("{\"__metadata__\":{\"k\":[\"a\"]}}", "", "not a string");
  expect_bad("{\"__metadata__\":\"x\"}", "", "__metadata__ is not an object");
  expect_bad("{\"__metadata__\":[]}", "", "__metadata__ is not an object");
  auto ok = image("{\"__metadata__\":{\"a\":\"1\",\"b\":\"\"}}");
  EXPECT_EQ(parse_safetensors(ok.data(), ok.size(), "t").metadata,
            (std::map<std::string, std::string>{{"a", "1"}, {"b", ""}}));
}

TEST(SafetensorsMalformed, NamesInMessagesAreSanitized) {
  const std::string name = "bad\\nname" + std::string(300, 'x');  // JSON escape -> a real newline
  try {
    auto b = image("{" + entry(name, "[4]", 0, 4, "F8_E4M3") + "}", std::string(4, 0));
    parse_safetensors(b.data(), b.size(), "ckpt");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad\\x0aname"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 300u) << msg;
  }
}

// Every prefix and many single-byte corruptions of a valid file either parse
// or throw fanout::Error (run under ASan/UBSan by the fuzzer as well).
TEST(SafetensorsMalformed, TruncationsAndBitFlipsNeverCrash) {
  TempDir dir;
  std::mt19937_64 rng(8);
  save_safetensors(dir.file("a.safetensors"), sample_tensors(rng), {{"k", "v"}});
  const auto good = read_bytes(dir.file("a.safetensors"));
  int errors = 0;
  for (size_t n = 0; n < good.size(); ++n) {
    try {
      parse_safetensors(good.data(), n, "prefix");
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_EQ(errors, static_cast<int>(good.size()));  // every proper prefix is malformed
  for (int i = 0; i < 3000; ++i) {
    auto b = good;
    b[rng() % std::min<size_t>(b.size(), 600)] ^= static_cast<uint8_t>(1u << (rng() % 8));
    try {
      parse_safetensors(b.data(), b.size(), "flip");
    } catch (const Error&) {
    }
  }
}

}  // namespace
}  // namespace fanout::io
