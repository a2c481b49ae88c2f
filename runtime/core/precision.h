// Training precision, by Lightning's names: "32" (float32), "bf16-mixed"
// (autocast to bfloat16) and "16-mixed" (autocast to float16 with loss
// scaling). Parameters, gradients and optimizer state stay float32 in every
// mode; runtime/nn/autocast.h says which op runs in which type.
#pragma once
#include <string>

#include "runtime/core/error.h"
#include "runtime/core/tensor.h"

namespace fanout {

enum class Precision { F32, BF16Mixed, F16Mixed };

inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::BF16Mixed: return "bf16-mixed";
    case Precision::F16Mixed: return "16-mixed";
    default: return "32";
  }
}

// "32", "bf16-mixed" or "16-mixed" ("32-true", "bf16" and "16" too, as
// Lightning accepts them); anything else is a one-line error.
inline Precision parse_precision(const std::string& s) {
  if (s == "32" || s == "32-true") return Precision::F32;
  if (s == "bf16-mixed" || s == "bf16") return Precision::BF16Mixed;
  if (s == "16-mixed" || s == "16") return Precision::F16Mixed;
  throw Error("unknown precision '" + s + "' (choose 32, bf16-mixed or 16-mixed)");
}

// The type autocast computes matrix products in: F32 (off), BF16 or F16.
inline DType autocast_dtype(Precision p) {
  return p == Precision::BF16Mixed ? DType::BF16 : p == Precision::F16Mixed ? DType::F16 : DType::F32;
}

}  // namespace fanout
