// NumPy's .npy format (version 1.0): a magic string, a Python-dict header
// giving dtype, order and shape, padded so the data starts on a 64-byte
// boundary, then the raw little-endian data in C order. Files written here
// load with numpy.load.
#pragma once
#include <string>

#include "runtime/core/tensor.h"

namespace fanout::io {

// Writes a CPU tensor (any dtype) atomically (write_file_atomic); one
// fanout::Error naming the file when it cannot be written.
void save_npy(const std::string& path, const Tensor& t);

}  // namespace fanout::io
