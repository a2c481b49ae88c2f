// safetensors checkpoint files: an 8-byte little-endian header length N, N
// bytes of JSON header ({"name": {"dtype", "shape", "data_offsets"}, ...,
// "__metadata__": {string: string}}), then the raw tensor bytes. The format
// PyTorch users exchange weights in (huggingface/safetensors); files written
// here load with safetensors.torch / safetensors.numpy and the other way round.
//
// Reading never trusts the file: every malformed input (truncated, bad JSON,
// unknown dtype, offsets out of range or overlapping, ...) is one fanout::Error
// whose message names the file and the problem; nothing is read out of bounds
// and nothing larger than the file is allocated.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"

namespace fanout::io {

class StagedFiles;  // runtime/io/file_io.h

// Named tensors in file order (by data offset) plus the string metadata.
struct TensorFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // CPU tensors
  std::map<std::string, std::string> metadata;
};

// Largest header accepted, as in the reference implementation (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Writes `tensors` (any device: each is copied to the host in turn) in the
// order given, data contiguous, header padded with spaces to a multiple of 8.
// Atomic (io::write_file_atomic): writes "<path>.tmp.<pid>.<n>", fsyncs it, renames it over `path` and
// fsyncs the directory; on failure the temporary file is removed, an existing
// file at `path` is left as it was, and fanout::Error is thrown.
// With `staged`, the file is added to those it replaces together (written
// into its temporary; staged->commit() renames it into place).
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {}, StagedFiles* staged = nullptr);

// Reads a whole file; tensors come back on the CPU.
TensorFile load_safetensors(const std::string& path);
// Reads and checks the header alone (a file cut short is refused as
// load_safetensors refuses it); returns its metadata.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

// Parses a file image held in memory; `what` names it in error messages.
TensorFile parse_safetensors(const uint8_t* data, size_t size, const std::string& what);

// The safetensors dtype string ("F32", "I32", "I64", "U8").
const char* safetensors_dtype(DType t);

}  // namespace fanout::io
