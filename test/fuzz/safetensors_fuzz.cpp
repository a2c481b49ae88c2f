// libFuzzer target for the safetensors parser: any byte string must either
// parse into tensors that fit inside it or throw fanout::Error. Built and run
// (with ASan and UBSan) by run_fuzz.sh, not by CMake.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "runtime/core/error.h"
#include "runtime/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const fanout::io::TensorFile f = fanout::io::parse_safetensors(data, size, "fuzz-input");
    // Tensors do not overlap and lie inside the input, so their bytes add up
    // to at most its size.
    uint64_t total = 0;
    for (const auto& [name, t] : f.tensors) {
      if (!t.defined() || !t.device().is_cpu() || t.dim() > fanout::Shape::kMaxDims) std::abort();
      total += t.nbytes();
      if (total > size) std::abort();
    }
  } catch (const fanout::Error&) {
    // Malformed input: the expected outcome for most inputs.
  }
  return 0;
}
