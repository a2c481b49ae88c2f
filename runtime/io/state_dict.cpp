// Matching a checkpoint's named tensors against a Module and copying them in.
#include "runtime/io/state_dict.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace fanout::io {

namespace {

constexpr size_t kListed = 5;  // names shown per list in messages

void append_list(std::ostringstream& os, const char* what, const std::vector<std::string>& v, bool& first) {
  if (v.empty()) return;
  os << (first ? "" : "; ") << v.size() << " " << what << " (";
  first = false;
  for (size_t i = 0; i < v.size() && i < kListed; ++i) os << (i ? ", " : "") << v[i];
  if (v.size() > kListed) os << ", and " << (v.size() - kListed) << " more";
  os << ")";
}

bool is_int(DType t) { return t == DType::I32 || t == DType::I64; }

// `src` (any device) converted to `dt` on the host; false when a value does not fit.
bool convert_int(const Tensor& src, DType dt, Tensor* out) {
  const Tensor h = src.device().is_cpu() ? src : src.to(Device::cpu());
  *out = Tensor::empty(h.shape(), dt, Device::cpu());
  for (int64_t i = 0; i < h.numel(); ++i) {
    const int64_t v = h.dtype() == DType::I64 ? h.data<int64_t>()[i] : h.data<int32_t>()[i];
    if (dt == DType::I64) {
      out->data<int64_t>()[i] = v;
    } else {
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) return false;
      out->data<int32_t>()[i] = static_cast<int32_t>(v);
    }
  }
  return true;
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16; }

// A floating-point `src` (any device) as float32 on the host, as torch's
// load_state_dict copies a half or double tensor into a float parameter; a
// finite double beyond float's range is an error naming `name`.
Tensor to_float32(const Tensor& src, const std::string& name) {
  const Tensor h = src.device().is_cpu() ? src : src.to(Device::cpu());
  Tensor out = Tensor::empty(h.shape(), DType::F32, Device::cpu());
  float* o = out.f32();
  const int64_t n = h.numel();
  if (h.dtype() == DType::F64) {
    const double* d = h.f64();
    for (int64_t i = 0; i < n; ++i) {
      o[i] = static_cast<float>(d[i]);
      FANOUT_USER_CHECK(std::isfinite(o[i]) || !std::isfinite(d[i]))
          << name << " holds " << d[i] << ", beyond float32's range";
    }
  } else if (h.dtype() == DType::BF16 || h.dtype() == DType::F16) {
    const uint16_t* b = h.data<uint16_t>();
    const bool bf16 = h.dtype() == DType::BF16;
    for (int64_t i = 0; i < n; ++i) o[i] = bf16 ? half::float_from_bf16(b[i]) : half::float_from_f16(b[i]);
  } else {
    std::copy(h.f32(), h.f32() + n, o);
  }
  return out;
}

}  // namespace

std::string LoadReport::summary() const {
  const std::string kept_note =
      kept.empty() ? "" : " (" + std::to_string(kept.size()) + " num_batches_tracked not in the file kept, as torch's)";
  if (ok()) return "all tensors matched" + kept_note;
  std::ostringstream os;
  bool first = true;
  append_list(os, "missing", missing, first);
  append_list(os, "unexpected", unexpected, first);
  append_list(os, "mismatched", mismatched, first);
  return os.str() + kept_note;
}

namespace {
LoadReport load_or_check(Module& m, const std::vector<std::pair<std::string, Tensor>>& tensors, bool strict,
                         bool write, const std::function<void(const std::string&, const Tensor&)>& accept = {}) {
  FANOUT_CHECK(m.materialized()) << "load_state_dict before materialize";
  std::vector<std::pair<std::string, Tensor>> model = m.state_dict();
  std::map<std::string, size_t> index;  // model name -> position
  for (size_t i = 0; i < model.size(); ++i) index.emplace(model[i].first, i);

  // Plan every copy first so that strict mode can refuse before writing.
  LoadReport r;
  std::vector<std::pair<size_t, Tensor>> plan;  // model position, source (converted when needed)
  std::vector<bool> found(model.size(), false);
  std::map<std::string, std::string> seen;  // stripped name -> name in the file
  std::map<std::string, std::string> alias;  // a tied parameter's second name -> its name
  for (auto& [prefix, mod] : m.named_modules())
    for (const auto& [a, own] : mod->tied_names())
      alias.emplace(prefix.empty() ? a : prefix + "." + a, prefix.empty() ? own : prefix + "." + own);
  for (const auto& [file_name, src] : tensors) {
    std::string name = file_name;
    if (name.rfind("module.", 0) == 0) name = name.substr(7);
    if (auto a = alias.find(name); a != alias.end()) name = a->second;
    auto [it, fresh] = seen.emplace(name, file_name);
    FANOUT_USER_CHECK(fresh) << "load_state_dict: the file has both " << it->second << " and " << file_name
                             << ", which name the same tensor";
    auto pos = index.find(name);
    if (pos == index.end()) {
      r.unexpected.push_back(name);
      continue;
    }
    found[pos->second] = true;
    const Tensor& dst = model[pos->second].second;
    FANOUT_CHECK(src.defined()) << "load_state_dict: tensor " << file_name << " is undefined";
    Tensor from = src;
    bool fits = src.shape() == dst.shape();
    if (fits && src.dtype() != dst.dtype()) {
      if (is_float(src.dtype()) && dst.dtype() == DType::F32)
        from = to_float32(src, name);
      else
        fits = is_int(src.dtype()) && is_int(dst.dtype()) && convert_int(src, dst.dtype(), &from);
    }
    if (!fits) {
      std::ostringstream os;
      os << name << ": file ";
      if (src.dtype() != dst.dtype()) os << dtype_name(src.dtype()) << " ";
      os << src.shape().str() << " vs model ";
      if (src.dtype() != dst.dtype()) os << dtype_name(dst.dtype()) << " ";
      os << dst.shape().str();
      r.mismatched.push_back(os.str());
      continue;
    }
    if (accept) accept(file_name, from);
    plan.emplace_back(pos->second, std::move(from));
  }
  // A BatchNorm's counter whose layer the file has (its running_mean) but not the counter: kept.
  const std::string counter = "num_batches_tracked";
  for (size_t i = 0; i < model.size(); ++i) {
    if (found[i]) continue;
    const std::string& name = model[i].first;
    const bool is_counter = name.size() >= counter.size() &&
                            name.compare(name.size() - counter.size(), counter.size(), counter) == 0 &&
                            (name.size() == counter.size() || name[name.size() - counter.size() - 1] == '.');
    const auto mean = is_counter ? index.find(name.substr(0, name.size() - counter.size()) + "running_mean")
                                 : index.end();
    (mean != index.end() && found[mean->second] ? r.kept : r.missing).push_back(name);
  }

  FANOUT_USER_CHECK(!strict || r.ok()) << "state dict does not match the model: " << r.summary();
  if (write)
    for (auto& [i, src] : plan) model[i].second.copy_from(src);
  return r;
}
}  // namespace

LoadReport load_state_dict(Module& m, const std::vector<std::pair<std::string, Tensor>>& tensors, bool strict,
                           const std::function<void(const std::string&, const Tensor&)>& accept) {
  return load_or_check(m, tensors, strict, true, accept);
}

void check_state_dict(Module& m, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  load_or_check(m, tensors, true, false);
}

std::vector<std::pair<std::string, Tensor>> state_dict_cpu(Module& m) {
  std::vector<std::pair<std::string, Tensor>> out = m.state_dict();
  for (auto& [name, t] : out) t = t.to(Device::cpu());
  return out;
}

}  // namespace fanout::io
