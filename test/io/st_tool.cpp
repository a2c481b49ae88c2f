// st_tool: the C++ side of the safetensors interop test (safetensors_interop.py).
//   st_tool write PATH   writes a fixed set of tensors (values by formula, see
//                        sample_value) with metadata {"format": "pt", "note": "fanout ✓"}
//   st_tool dump PATH    loads PATH and prints it as JSON:
//                        {"metadata": {...}, "tensors": [{"name", "dtype", "shape", "values"}, ...]}
//   st_tool npy DIR      writes the same tensors as DIR/<index>.npy (io::save_npy), in order
//   st_tool npyload PATH loads PATH with io::load_npy and prints it as one such tensor:
//                        {"dtype", "shape", "values"}
// Exit codes: 0 ok, 1 fanout::Error (message on stderr), 2 usage.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/core/half.h"
#include "runtime/core/error.h"
#include "runtime/io/npy.h"
#include "runtime/io/safetensors.h"

using namespace fanout;

namespace {

// Element i of a tensor of dtype t; exact in every dtype (the script uses the same formulas).
double sample_value(DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<double>(i) * 0.25 - 3.0;
    case DType::I32: return static_cast<double>(i * 7 - 20);
    case DType::I64: return 0;  // set apart: large values below
    case DType::U8: return static_cast<double>((i * 37) % 256);
    case DType::F64: return static_cast<double>(i) / 3.0 - 1.0;  // uses all 53 bits
  }
  return 0;
}

Tensor make(const Shape& s, DType t) {
  Tensor x = Tensor::empty(s, t);
  for (int64_t i = 0; i < x.numel(); ++i) {
    switch (t) {
      case DType::F32: x.data<float>()[i] = static_cast<float>(sample_value(t, i)); break;
      case DType::I32: x.data<int32_t>()[i] = static_cast<int32_t>(sample_value(t, i)); break;
      case DType::I64: x.data<int64_t>()[i] = 1'000'000'000'000LL * (i + 1) + i; break;
      case DType::U8: x.data<uint8_t>()[i] = static_cast<uint8_t>(sample_value(t, i)); break;
      case DType::F64: x.data<double>()[i] = sample_value(t, i); break;
    }
  }
  return x;
}

std::vector<std::pair<std::string, Tensor>> samples() {
  return {
    {"layer1.0.conv1.weight", make(Shape{4, 3, 2, 2}, DType::F32)},
    {"fc.bias", make(Shape{10}, DType::F32)},
    {"bn.num_batches_tracked", make(Shape{}, DType::I64)},
    {"labels", make(Shape{2, 3}, DType::I32)},
    {"pixels", make(Shape{2, 2, 3}, DType::U8)},
    {"counts", make(Shape{3}, DType::I64)},
    {"doubles", make(Shape{2, 3}, DType::F64)},
    {"empty", make(Shape{0, 3}, DType::F32)},
    {"five_d", make(Shape{1, 2, 1, 2, 2}, DType::F32)},
    {"\xc3\xbcnicode.weight", make(Shape{2}, DType::F32)},
  };
}

int write(const std::string& path) {
  io::save_safetensors(path, samples(), {{"format", "pt"}, {"note", "fanout \xe2\x9c\x93"}});
  return 0;
}

int npy(const std::string& dir) {
  const auto s = samples();
  for (size_t i = 0; i < s.size(); ++i) io::save_npy(dir + "/" + std::to_string(i) + ".npy", s[i].second);
  return 0;
}

// {"dtype", "shape", "values"} of a CPU tensor.
nlohmann::json tensor_json(const Tensor& t) {
  nlohmann::json e;
  e["dtype"] = io::safetensors_dtype(t.dtype());
  e["shape"] = nlohmann::json::array();
  for (int i = 0; i < t.dim(); ++i) e["shape"].push_back(t.size(i));
  nlohmann::json v = nlohmann::json::array();
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype()) {
      case DType::F32: v.push_back(static_cast<double>(t.data<float>()[i])); break;  // exact
      case DType::I32: v.push_back(t.data<int32_t>()[i]); break;
      case DType::I64: v.push_back(t.data<int64_t>()[i]); break;
      case DType::U8: v.push_back(t.data<uint8_t>()[i]); break;
      case DType::F64: v.push_back(t.data<double>()[i]); break;  // printed to round-trip
      case DType::F16: v.push_back(static_cast<double>(half::float_from_f16(t.data<uint16_t>()[i]))); break;
      case DType::BF16: v.push_back(static_cast<double>(half::float_from_bf16(t.data<uint16_t>()[i]))); break;
    }
  }
  e["values"] = std::move(v);
  return e;
}

int dump(const std::string& path) {
  io::TensorFile f = io::load_safetensors(path);
  nlohmann::json out;
  out["metadata"] = f.metadata;
  out["tensors"] = nlohmann::json::array();
  for (const auto& [name, t] : f.tensors) {
    nlohmann::json e = tensor_json(t);
    e["name"] = name;
    out["tensors"].push_back(std::move(e));
  }
  std::cout << out.dump() << "\n";
  return 0;
}

int npyload(const std::string& path) {
  std::cout << tensor_json(io::load_npy(path)).dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc == 3 ? argv[1] : "";
  if (cmd != "write" && cmd != "dump" && cmd != "npy" && cmd != "npyload") {
    std::fprintf(stderr, "usage: st_tool write|dump|npyload PATH, st_tool npy DIR\n");
    return 2;
  }
  try {
    if (cmd == "npyload") return npyload(argv[2]);
    return cmd == "write" ? write(argv[2]) : cmd == "dump" ? dump(argv[2]) : npy(argv[2]);
  } catch (const Error& e) {
    std::fprintf(stderr, "st_tool: %s\n", e.what());
    return 1;
  }
}
