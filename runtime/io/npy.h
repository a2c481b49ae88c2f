// NumPy's .npy format: a magic string, a Python-dict header giving dtype,
// order and shape, then the raw data in C order. The writer emits version
// 1.0, padded so the data starts on a 64-byte boundary; files written here
// load with numpy.load. The reader takes what numpy.save writes for fanout's
// dtypes: versions 1.0, 2.0 and 3.0.
#pragma once
#include <string>

#include "runtime/core/tensor.h"

namespace fanout::io {

// Writes a CPU tensor (any dtype) atomically (write_file_atomic); one
// fanout::Error naming the file when it cannot be written.
void save_npy(const std::string& path, const Tensor& t);

// Reads a .npy file into a CPU tensor. Accepted: versions 1.0, 2.0 and 3.0;
// descr '<f4', '<f8', '<i4', '<i8' and '|u1' (or '<u1'); fortran_order False;
// up to 5 dims, 0-size dims included. A scalar (shape ()) becomes a 0-d
// tensor (dim() == 0, numel() == 1), which save_npy writes back as shape ().
// Anything else (not a regular file, bad magic or version, a header that is
// not a dict literal with exactly the keys descr, fortran_order and shape,
// big-endian or unsupported dtypes, Fortran order, negative or overflowing
// dims, data shorter or longer than the shape says) is one fanout::Error
// naming the file and the problem. Nothing larger than the file is allocated.
Tensor load_npy(const std::string& path);

}  // namespace fanout::io
