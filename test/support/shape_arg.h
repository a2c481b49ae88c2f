// A sample shape as the test tools take it on their command lines: "3x32x32".
#pragma once
#include <sstream>
#include <string>

#include "runtime/core/tensor.h"

namespace fanout::testing {

inline Shape parse_shape(const std::string& s) {
  Shape shape;
  std::stringstream ss(s);
  std::string part;
  shape.ndim = 0;
  while (std::getline(ss, part, 'x')) shape.d[shape.ndim++] = std::stoll(part);
  return shape;
}

}  // namespace fanout::testing
