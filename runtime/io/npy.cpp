// .npy writer.
#include "runtime/io/npy.h"

#include <cstring>

#include "runtime/core/error.h"
#include "runtime/io/safetensors.h"

namespace fanout::io {

namespace {
const char* npy_descr(DType t) {
  switch (t) {
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::U8: return "|u1";
  }
  FANOUT_FAIL() << "no .npy dtype for " << dtype_name(t);
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

}  // namespace fanout::io
