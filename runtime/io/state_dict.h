// Loading named tensors (a checkpoint's state dict) into a Module, and taking
// host copies of a Module's state. Names are torchvision's
// (`layer1.0.bn1.running_mean`); a leading "module." (what PyTorch's
// DataParallel adds) is stripped from the incoming names.
//
//   io::save_safetensors(path, m.state_dict());                       // any device
//   io::load_state_dict(m, io::load_safetensors(path).tensors, true); // into m's device
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/nn/module.h"

namespace fanout::io {

struct LoadReport {
  std::vector<std::string> missing;     // in the model, not in the file
  std::vector<std::string> unexpected;  // in the file, not in the model
  std::vector<std::string> mismatched;  // "fc.weight: file (3, 4) vs model (4, 3)"
  // BatchNorm's num_batches_tracked the file lacks (torch's own files from
  // before it existed, torchvision's ImageNet weights): kept at the model's
  // value, as torch's BatchNorm loads such a file; no mismatch.
  std::vector<std::string> kept;
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  // One line: "2 missing (a, b); 1 mismatched (...)", each list cut after 5
  // names ("and N more"); "all tensors matched" when ok(), with the kept
  // ones counted.
  std::string summary() const;
};

// Copies each incoming tensor (any device) into the parameter or buffer of
// the same name, on whatever device `m` lives. Shapes must match exactly and
// dtypes too, except that a float32 tensor takes float64, bfloat16 or
// float16 values (rounded or widened to float32, as torch's load_state_dict
// copies them) and integer buffers (num_batches_tracked) take either I32 or
// I64 when the value fits.
// strict: any missing, unexpected or mismatched name throws fanout::Error
// listing them, before anything is modified. Non-strict: loads what matches
// and reports the rest. `accept`, when given, sees each tensor that would be
// copied (its name in the file; after that conversion) before anything is,
// and may throw to refuse.
LoadReport load_state_dict(Module& m, const std::vector<std::pair<std::string, Tensor>>& tensors, bool strict,
                           const std::function<void(const std::string&, const Tensor&)>& accept = {});

// load_state_dict's strict checks without loading: throws what it would.
void check_state_dict(Module& m, const std::vector<std::pair<std::string, Tensor>>& tensors);

// Host copies of every parameter and buffer, in state_dict order.
std::vector<std::pair<std::string, Tensor>> state_dict_cpu(Module& m);

}  // namespace fanout::io
