// CUDA 2-D and 3-D convolution through cuDNN (legacy convolution API of
// cuDNN 9), one implementation for both ranks; the CPU counterpart (oneDNN)
// in kernels/cpu/conv.cpp. 2-D uses cuDNN's 4-D descriptors, 3-D its N-d ones.
//
// Per (device, direction, shapes, geometry, math options) a plan holds the
// descriptors and the chosen algorithm with its workspace size. Plans are
// built once, outside the cache lock (building may run cuDNN's timed search),
// and never change afterwards, so threads share them without locking.
// Algorithms: cudnnGet*Algorithm_v7 heuristics by default, cudnnFind*AlgorithmEx
// when ctx.math.cudnn_benchmark; only CUDNN_DETERMINISTIC ones when
// ctx.math.deterministic. Math: CUDNN_FMA_MATH (plain float32, and no FFT or
// Winograd algorithm) unless ctx.math.allow_tf32, which lets cuDNN use TF32
// tensor cores and any algorithm. FANOUT_CUDNN_LOG=1 prints each choice.
// Results: y (=), dx (=, beta 0), dw (+=, beta 1), db (+=, own reduction kernel).
// Under autocast (ctx.math.autocast BF16 or F16) cuDNN runs in that type with
// float32 accumulation and tensor-op math (kernels/cuda/low_precision.cuh):
// x, w and dy are narrowed (rounded) into low-type buffers as they are read,
// y and dx come back rounded to it, and dw's term is rounded before it is
// added; db is summed from dy as given (kernels::conv_rounds_in_low_type).
// The low-type copies are channels-last (NHWC, filters KRSC), made as the
// operands are narrowed and widened back to NCHW with the results, in one
// pass each: cuDNN's tensor-core kernels work in NHWC and, handed NCHW,
// transpose every operand and result themselves, a fifth of a bf16 resnet18
// step's GPU time (bench/RESULTS.md, "2026-11-28, session 25"). A shape and direction for which
// cuDNN offers no usable channels-last algorithm (say, only nondeterministic
// ones when determinism is asked for) falls back to NCHW copies; the plan
// records which. FANOUT_CUDNN_LAYOUT=nchw makes every low-type copy NCHW, to
// measure the difference. Activations stored in the autocast type (low-type
// storage, either layout) go to cuDNN as they are when the plan's layout is
// theirs, and cuDNN writes y and dx straight into such tensors: no copies.
// A bias is added to y as stored (a low-type y rounds again: the GPU's one
// rounding more than the CPU's) and its gradient summed from dy as stored.
#include "kernels/conv.h"
#include "kernels/conv_bias.h"
#include "kernels/convert.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <shared_mutex>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {

// Largest workspace an algorithm may ask for before the next one is taken.
constexpr size_t kMaxWorkspaceBytes = size_t{512} << 20;

enum class Dir : int { Forward = 0, BackwardData = 1, BackwardFilter = 2 };

// x (N, C, spatial...), w (OC, C, kernel...), y (N, OC, out...) with 2 or 3
// spatial dims, (D,) H, W; the unused third entries are 0.
struct ConvShape {
  int rank;  // spatial dims
  int64_t n, c, oc;
  std::array<int64_t, 3> in{}, k{}, out{};
  int64_t stride, pad;
  DType dt = DType::F32;  // of x, w and y: F32, or the autocast type
  bool channels_last = false;  // x, y (N, spatial..., C) and w (OC, kernel..., C)
  const char* name() const { return rank == 2 ? "conv2d" : "conv3d"; }
  int64_t out_plane() const {  // elements of one output channel plane
    int64_t p = 1;
    for (int i = 0; i < rank; ++i) p *= out[i];
    return p;
  }
};

ConvShape conv_shape(const Tensor& x, const Tensor& w, const Tensor& y, int64_t stride, int64_t pad) {
  ConvShape s{x.dim() - 2, x.size(0), x.size(1), w.size(0), {}, {}, {}, stride, pad};
  for (int i = 0; i < s.rank; ++i) {
    s.in[i] = x.size(2 + i);
    s.k[i] = w.size(2 + i);
    s.out[i] = y.size(2 + i);
  }
  return s;
}

// cuDNN's legacy descriptors take int dimensions and int strides.
void check_int_range(const char* op, const Tensor& x, const Tensor& w, const Tensor& y, int64_t stride, int64_t pad) {
  FANOUT_CHECK(x.numel() <= INT32_MAX && w.numel() <= INT32_MAX && y.numel() <= INT32_MAX && stride <= INT32_MAX &&
               pad <= INT32_MAX)
      << op << ": x " << x.shape().str() << ", w " << w.shape().str() << ", y " << y.shape().str()
      << " exceed cuDNN's 32-bit limits";
}

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr;  // (N, C, spatial...)
  cudnnTensorDescriptor_t y = nullptr;  // (N, OC, out...)
  cudnnFilterDescriptor_t w = nullptr;  // (OC, C, kernel...)
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = -1;  // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  size_t ws = 0;  // workspace bytes of `algo`
  bool channels_last = false;  // the layout of the low-type copies it runs on
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan() {  // never throws
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

// ---- per-direction cuDNN entry points ----

// Buffers for cudnnFind*AlgorithmEx: two inputs and the output it may overwrite.
struct FindBuffers {
  const void* in0;
  const void* in1;
  void* out;
};

// One direction's cuDNN calls. Every call takes three descriptors in one
// order, (A, B, C): forward (x, w, y), backward data (w, dy, dx), backward
// filter (x, dy, dw); FindBuffers holds the same three in that order.
template <class PerfT, auto MaxCount, auto Heuristics, auto Find, auto Workspace, auto A, auto B, auto C,
          auto... Transforms>
struct CudnnAlgos {
  using Perf = PerfT;
  using Algo = decltype(PerfT{}.algo);
  // FFT and Winograd: kept out where float32 accuracy or low types are asked.
  static bool transform_based(Algo a) { return ((a == Transforms) || ...); }
  static int max_count(cudnnHandle_t h) {
    int n = 0;
    FANOUT_CUDNN_CHECK(MaxCount(h, &n));
    return n;
  }
  static void heuristics(cudnnHandle_t h, const ConvPlan& p, int want, int* got, Perf* out) {
    FANOUT_CUDNN_CHECK(Heuristics(h, p.*A, p.*B, p.conv, p.*C, want, got, out));
  }
  // For backward filter, b.out is a scratch buffer: the real dw accumulates.
  static void find(cudnnHandle_t h, const ConvPlan& p, const FindBuffers& b, int want, int* got, Perf* out, void* ws,
                   size_t ws_bytes) {
    FANOUT_CUDNN_CHECK(Find(h, p.*A, b.in0, p.*B, b.in1, p.conv, p.*C, b.out, want, got, out, ws, ws_bytes));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, Algo a, size_t* bytes) {
    return Workspace(h, p.*A, p.*B, p.conv, p.*C, a, bytes);
  }
};

template <Dir D>
struct Algos;

template <> struct Algos<Dir::Forward> : CudnnAlgos<cudnnConvolutionFwdAlgoPerf_t,
    cudnnGetConvolutionForwardAlgorithmMaxCount, cudnnGetConvolutionForwardAlgorithm_v7,
    cudnnFindConvolutionForwardAlgorithmEx, cudnnGetConvolutionForwardWorkspaceSize, &ConvPlan::x, &ConvPlan::w,
    &ConvPlan::y, CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
    CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED> {};
template <> struct Algos<Dir::BackwardData> : CudnnAlgos<cudnnConvolutionBwdDataAlgoPerf_t,
    cudnnGetConvolutionBackwardDataAlgorithmMaxCount, cudnnGetConvolutionBackwardDataAlgorithm_v7,
    cudnnFindConvolutionBackwardDataAlgorithmEx, cudnnGetConvolutionBackwardDataWorkspaceSize, &ConvPlan::w,
    &ConvPlan::y, &ConvPlan::x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED> {};
template <> struct Algos<Dir::BackwardFilter> : CudnnAlgos<cudnnConvolutionBwdFilterAlgoPerf_t,
    cudnnGetConvolutionBackwardFilterAlgorithmMaxCount, cudnnGetConvolutionBackwardFilterAlgorithm_v7,
    cudnnFindConvolutionBackwardFilterAlgorithmEx, cudnnGetConvolutionBackwardFilterWorkspaceSize, &ConvPlan::x,
    &ConvPlan::y, &ConvPlan::w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED> {};

const char* dir_name(Dir d) {
  return d == Dir::Forward ? "forward" : d == Dir::BackwardData ? "backward data" : "backward filter";
}

// ---- plan construction ----

cudnnDataType_t cudnn_type(DType t) {
  return t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : t == DType::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

// A packed (row-major) N-d tensor descriptor.
void set_tensor_nd(cudnnTensorDescriptor_t t, cudnnDataType_t dt, int nd, const int* dims) {
  std::array<int, 5> strides{};
  strides[nd - 1] = 1;
  for (int i = nd - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  FANOUT_CUDNN_CHECK(cudnnSetTensorNdDescriptor(t, dt, nd, dims, strides.data()));
}

// Tensors and filter in s.dt; the convolution computes in float32 whatever the data type.
void make_descriptors(ConvPlan& p, const ConvShape& s) {
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  const cudnnDataType_t dt = cudnn_type(s.dt);
  const cudnnTensorFormat_t fmt = s.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  FANOUT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.x));
  FANOUT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.y));
  FANOUT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p.w));
  FANOUT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p.conv));
  std::array<int, 5> out{};
  if (s.rank == 2) {
    FANOUT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.x, fmt, dt, i(s.n), i(s.c), i(s.in[0]), i(s.in[1])));
    FANOUT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.y, fmt, dt, i(s.n), i(s.oc), i(s.out[0]), i(s.out[1])));
    FANOUT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p.w, dt, fmt, i(s.oc), i(s.c), i(s.k[0]), i(s.k[1])));
    FANOUT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(p.conv, i(s.pad), i(s.pad), i(s.stride), i(s.stride), 1, 1,
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    FANOUT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(p.conv, p.x, p.w, &out[0], &out[1], &out[2], &out[3]));
  } else {
    const std::array<int, 5> xd{i(s.n), i(s.c), i(s.in[0]), i(s.in[1]), i(s.in[2])};
    const std::array<int, 5> yd{i(s.n), i(s.oc), i(s.out[0]), i(s.out[1]), i(s.out[2])};
    const std::array<int, 5> wd{i(s.oc), i(s.c), i(s.k[0]), i(s.k[1]), i(s.k[2])};
    if (s.channels_last) {  // dims in NCDHW order, strides those of NDHWC
      FANOUT_CUDNN_CHECK(cudnnSetTensorNdDescriptorEx(p.x, fmt, dt, 5, xd.data()));
      FANOUT_CUDNN_CHECK(cudnnSetTensorNdDescriptorEx(p.y, fmt, dt, 5, yd.data()));
    } else {
      set_tensor_nd(p.x, dt, 5, xd.data());
      set_tensor_nd(p.y, dt, 5, yd.data());
    }
    FANOUT_CUDNN_CHECK(cudnnSetFilterNdDescriptor(p.w, dt, fmt, 5, wd.data()));
    const std::array<int, 3> pad{i(s.pad), i(s.pad), i(s.pad)}, stride{i(s.stride), i(s.stride), i(s.stride)},
        dilation{1, 1, 1};
    FANOUT_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(p.conv, 3, pad.data(), stride.data(), dilation.data(),
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    FANOUT_CUDNN_CHECK(cudnnGetConvolutionNdForwardOutputDim(p.conv, p.x, p.w, 5, out.data()));
  }
  // The output shape must be cuDNN's too.
  bool same = out[0] == s.n && out[1] == s.oc;
  for (int d = 0; d < s.rank; ++d) same = same && out[2 + d] == s.out[d];
  if (!same) {
    std::string got = std::to_string(out[0]), want = std::to_string(s.n) + ", " + std::to_string(s.oc);
    for (int d = 1; d < s.rank + 2; ++d) got += ", " + std::to_string(out[d]);
    for (int d = 0; d < s.rank; ++d) want += ", " + std::to_string(s.out[d]);
    FANOUT_FAIL() << s.name() << ": cuDNN computes output (" << got << "), expected (" << want << ")";
  }
}

// Math type the descriptor asks for before the search. With TF32 allowed,
// CUDNN_DEFAULT_MATH lets cuDNN take TF32 tensor-core kernels for float data
// (as PyTorch with cudnn.allow_tf32); otherwise CUDNN_FMA_MATH keeps it to
// plain float32 FMA kernels. Low-type data: tensor-op math.
cudnnMathType_t requested_math(const MathOptions& m, bool low) {
  if (low) return CUDNN_TENSOR_OP_MATH;
  return m.allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// Usable results: found, deterministic when asked, and never a math type that
// may lower float32 below TF32 (ALLOW_CONVERSION may down-convert to FP16).
// With TF32 off the result must have float32 accuracy: no tensor-op math and
// no FFT or Winograd algorithm: on an H100 FFT's error reached a weight
// gradient and Winograd let replicas drift from one device (README "GPUs").
// Low-type data (low): tensor-op math is the point; FFT and Winograd stay
// out whatever the TF32 setting (which is about float32 math).
template <class A>
bool acceptable(const typename A::Perf& p, const MathOptions& m, bool low) {
  if (p.status != CUDNN_STATUS_SUCCESS) return false;
  if ((low || !m.allow_tf32) && A::transform_based(p.algo)) return false;
  if (m.deterministic && p.determinism != CUDNN_DETERMINISTIC) return false;
  if (p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
  if (!low && !m.allow_tf32 && p.mathType == CUDNN_TENSOR_OP_MATH) return false;
  return true;
}

std::string shape_str(const ConvShape& s) {
  std::string x = "x (" + std::to_string(s.n) + ", " + std::to_string(s.c);
  std::string w = "w (" + std::to_string(s.oc) + ", " + std::to_string(s.c);
  for (int d = 0; d < s.rank; ++d) {
    x += ", " + std::to_string(s.in[d]);
    w += ", " + std::to_string(s.k[d]);
  }
  return x + "), " + w + "), stride " + std::to_string(s.stride) + ", padding " + std::to_string(s.pad) +
         (s.channels_last ? ", channels-last" : "");
}

// FANOUT_CUDNN_LOG=1: print each plan's choice.
bool cudnn_log() {
  static const bool on = [] {
    const char* v = std::getenv("FANOUT_CUDNN_LOG");
    return v && std::string(v) == "1";
  }();
  return on;
}

// The plan for s, or (when cuDNN offers no usable algorithm) nullptr if
// `may_fail`, else a one-line error.
template <Dir D>
std::unique_ptr<ConvPlan> build_plan(Context& ctx, cudnnHandle_t h, const ConvShape& s, const FindBuffers& bufs,
                                     bool may_fail) {
  using A = Algos<D>;
  auto plan = std::make_unique<ConvPlan>();
  plan->channels_last = s.channels_last;
  make_descriptors(*plan, s);
  const MathOptions m = ctx.math;
  const bool low = s.dt != DType::F32;
  FANOUT_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, requested_math(m, low)));

  const int max_algos = std::max(1, A::max_count(h));
  std::vector<typename A::Perf> perf(static_cast<size_t>(max_algos));
  int got = 0;
  A::heuristics(h, *plan, max_algos, &got, perf.data());
  if (m.cudnn_benchmark) {
    // Time the candidates on the real data, with as much workspace as the
    // hungriest acceptable heuristic candidate wants (up to the cap).
    size_t search_ws = 0;
    for (int i = 0; i < got; ++i)
      if (acceptable<A>(perf[i], m, low) && perf[i].memory <= kMaxWorkspaceBytes)
        search_ws = std::max(search_ws, perf[i].memory);
    void* ws = search_ws ? ctx.workspace(search_ws) : nullptr;
    got = 0;
    // cuDNN may capture a CUDA graph while it times the candidates: no other
    // thread may make a call that capture forbids meanwhile.
    ::fanout::detail::CaptureExclusive exclusive;
    A::find(h, *plan, bufs, max_algos, &got, perf.data(), ws, search_ws);
  }
  // Results come best first; take the first acceptable one whose workspace,
  // asked again with the math type it will run under, fits the cap.
  for (int i = 0; i < got; ++i) {
    const auto& p = perf[i];
    if (!acceptable<A>(p, m, low)) continue;
    const cudnnMathType_t math = m.allow_tf32 || low ? p.mathType : CUDNN_FMA_MATH;
    FANOUT_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, math));
    size_t bytes = 0;
    if (A::workspace(h, *plan, p.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    if (bytes > kMaxWorkspaceBytes) continue;
    plan->algo = static_cast<int>(p.algo);
    plan->ws = bytes;
    if (cudnn_log())
      std::fprintf(stderr, "fanout: %s %s %s %s: algorithm %d, %s math, workspace %zu bytes (%s)\n", s.name(),
                   dir_name(D), dtype_name(s.dt), shape_str(s).c_str(), plan->algo,
                   math == CUDNN_FMA_MATH ? "FMA" : math == CUDNN_DEFAULT_MATH ? "default" : "tensor-op", bytes,
                   m.cudnn_benchmark ? "timed search" : "heuristics");
    return plan;
  }
  if (may_fail) return nullptr;
  FANOUT_FAIL() << s.name() << " " << dir_name(D) << ": cuDNN offers no usable algorithm for " << dtype_name(s.dt)
                << " " << shape_str(s)
                << (m.deterministic ? " (deterministic only)" : "") << (m.allow_tf32 ? "" : " (TF32 off)") << " among "
                << got << " candidates";
}

using PlanKey = std::array<int64_t, 19>;

// make_bufs(channels_last) gives the buffers for the timed search in that
// layout; it is called only when a plan is built, so a warm step allocates
// nothing. A channels-last shape without a usable algorithm gets an NCHW plan.
template <Dir D, class MakeBufs>
const ConvPlan& get_plan(Context& ctx, cudnnHandle_t h, const ConvShape& s, const MakeBufs& make_bufs) {
  const MathOptions& m = ctx.math;
  const PlanKey key{ctx.device().index, static_cast<int64_t>(D), s.rank, s.n, s.c, s.in[0], s.in[1], s.in[2], s.oc,
                    s.k[0], s.k[1], s.k[2], s.stride, s.pad, m.allow_tf32, m.deterministic, m.cudnn_benchmark,
                    static_cast<int64_t>(s.dt), s.channels_last};
  return detail::PlanCache<PlanKey, ConvPlan>::instance().get(key, [&] {
    std::unique_ptr<ConvPlan> plan;
    if (s.channels_last) {
      plan = build_plan<D>(ctx, h, s, make_bufs(true), true);
      if (!plan && cudnn_log())
        std::fprintf(stderr, "fanout: %s %s %s %s: no usable algorithm, NCHW copies instead\n", s.name(),
                     dir_name(D), dtype_name(s.dt), shape_str(s).c_str());
    }
    if (!plan) {
      ConvShape nchw = s;
      nchw.channels_last = false;
      plan = build_plan<D>(ctx, h, nchw, make_bufs(false), false);
    }
    return plan;
  });
}

// ---- low-type copies ----

// Whether low-type copies are channels-last (see the top of the file).
bool low_channels_last() {
  static const bool yes = [] {
    const char* v = std::getenv("FANOUT_CUDNN_LAYOUT");
    const std::string layout = v ? v : "nhwc";
    FANOUT_USER_CHECK(layout == "nhwc" || layout == "nchw")
        << "FANOUT_CUDNN_LAYOUT must be nhwc or nchw, not '" << layout << "'";
    return layout == "nhwc";
  }();
  return yes;
}

Shape low_shape(const Shape& s, bool channels_last) { return channels_last ? channels_last_shape(s) : s; }

// t narrowed into `role`'s low-type buffer (detail::low_buffer), channels-last when asked.
Tensor low_copy(Context& ctx, int role, const Tensor& t, bool channels_last) {
  if (!channels_last) return detail::narrowed(ctx, role, t);
  Tensor l = detail::low_buffer(ctx, role, channels_last_shape(t.shape()));
  narrow_channels_last(ctx, t, l);
  return l;
}

// dst (float32) = or += widen(src), src channels-last when asked.
void widen_back(Context& ctx, const Tensor& src, Tensor& dst, bool channels_last, bool accumulate) {
  if (channels_last) return widen_channels_first(ctx, src, dst, accumulate);
  if (accumulate) return detail::add_widened(ctx, src, dst.f32());
  convert(ctx, src, dst);
}

MemoryFormat format_of(bool channels_last) {
  return channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

// An activation as the plan's low-type operand in layout cl: the tensor
// itself when it is stored so (the autocast type in that layout: no copy),
// else a copy into `role`'s low buffer, narrowed from float32 or moved from
// the other layout.
Tensor low_operand(Context& ctx, int role, const Tensor& t, bool cl) {
  if (t.dtype() == ctx.math.autocast && t.channels_last() == cl) return t;
  if (t.dtype() == DType::F32 && !t.channels_last()) return low_copy(ctx, role, t, cl);
  Tensor l = detail::low_buffer(ctx, role, low_shape(t.shape(), cl)).as(t.shape(), ctx.math.autocast, format_of(cl));
  convert(ctx, t, l);
  return l;
}

// Where cuDNN writes an output bound for `out` in layout cl: out itself when
// it is stored so, else `role`'s low buffer (store_output moves it to out).
Tensor low_output(Context& ctx, int role, const Tensor& out, bool cl) {
  if (out.dtype() == ctx.math.autocast && out.channels_last() == cl) return out;
  return detail::low_buffer(ctx, role, low_shape(out.shape(), cl));
}

// out = the low-type result `low` (layout cl): widened into a float32 out, or
// moved between layouts into a low-type one; nothing when cuDNN wrote out.
void store_output(Context& ctx, const Tensor& low, Tensor& out, bool cl) {
  if (low.raw() == out.raw()) return;
  if (out.dtype() == DType::F32 && !out.channels_last()) return widen_back(ctx, low, out, cl, false);
  convert(ctx, low.as(out.shape(), ctx.math.autocast, format_of(cl)), out);
}

// ---- bias kernels, on every storage (float32, bfloat16, float16; NC... or channels-last) ----

// y (N, OC, S) += b[oc], rounded to y's type as it is stored
template <class T, class I>
__global__ void add_bias_kernel(T* __restrict__ y, const float* __restrict__ b, I oc, I s, I total, bool last) {
  for (I i : detail::grid_stride(total)) {
    const I ch = last ? i % oc : (i / s) % oc;
    y[i] = detail::narrow<T>(detail::widen(y[i]) + b[ch]);
  }
}

// y (N, OC, out...) = conv(x, w) (+ b), written (=).
void forward(const char* op, Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, int64_t stride,
             int64_t pad, Tensor& y) {
  if (y.numel() == 0) return;
  check_int_range(op, x, w, y, stride, pad);
  detail::DeviceScope scope(ctx);
  auto h = static_cast<cudnnHandle_t>(ctx.cudnn());  // bound to ctx.compute() at creation
  ConvShape s = conv_shape(x, w, y, stride, pad);
  // Low precision: the operands narrowed into low-type buffers in the plan's
  // layout, and the output through one.
  const bool low = detail::low_precision(ctx);
  if (low) {
    s.dt = ctx.math.autocast;
    s.channels_last = low_channels_last();
  }
  Tensor xl = x, wl = w, yl = y;
  const auto copies = [&](bool cl) {
    if (!low) return;
    xl = low_operand(ctx, 0, x, cl);
    wl = low_copy(ctx, 1, w, cl);
    yl = low_output(ctx, 2, y, cl);
  };
  const ConvPlan& p = get_plan<Dir::Forward>(ctx, h, s, [&](bool cl) {
    copies(cl);
    return FindBuffers{xl.raw(), wl.raw(), yl.raw()};
  });
  copies(p.channels_last);
  void* ws = p.ws ? ctx.workspace(p.ws) : nullptr;
  const float one = 1.0f, zero = 0.0f;  // beta 0: y is not read (it may hold NaN)
  FANOUT_CUDNN_CHECK(cudnnConvolutionForward(h, &one, p.x, xl.raw(), p.w, wl.raw(), p.conv,
                                             static_cast<cudnnConvolutionFwdAlgo_t>(p.algo), ws, p.ws, &zero, p.y,
                                             yl.raw()));
  if (low) store_output(ctx, yl, y, p.channels_last);
  if (b) channel_bias_add(ctx, y, *b);  // on y as stored: a low-type y rounds again (the GPU's one rounding more)
}

// dx (=) when non-null; dw (+=) when defined; db (+=) when non-null.
void backward(const char* op, Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride,
              int64_t pad, Tensor* dx, Tensor& dw, Tensor* db) {
  if (dy.numel() == 0) return;  // N == 0: nothing to add, dx is empty
  check_int_range(op, x, w, dy, stride, pad);
  detail::DeviceScope scope(ctx);
  auto h = static_cast<cudnnHandle_t>(ctx.cudnn());
  ConvShape s = conv_shape(x, w, dy, stride, pad);
  const float one = 1.0f, zero = 0.0f;
  // Low precision: dy narrowed once for both products (twice if their plans
  // differ in layout); dx through a low-type buffer; dw's term computed into
  // one (beta 0) and added widened.
  const bool low = detail::low_precision(ctx);
  if (low) {
    s.dt = ctx.math.autocast;
    s.channels_last = low_channels_last();
  }
  // dy's low-type copy, made again only when the two products' plans differ in layout.
  Tensor dyl = dy;
  int dy_layout = -1;  // none yet; else whether channels-last
  const auto dy_copy = [&](bool cl) {
    if (!low || dy_layout == static_cast<int>(cl)) return;
    dyl = low_operand(ctx, 3, dy, cl);
    dy_layout = cl;
  };
  if (dx) {
    Tensor wl = w, dxl = *dx;
    const auto copies = [&](bool cl) {
      if (!low) return;
      dy_copy(cl);
      wl = low_copy(ctx, 1, w, cl);
      dxl = low_output(ctx, 2, *dx, cl);
    };
    const ConvPlan& p = get_plan<Dir::BackwardData>(ctx, h, s, [&](bool cl) {
      copies(cl);
      return FindBuffers{wl.raw(), dyl.raw(), dxl.raw()};
    });
    copies(p.channels_last);
    void* ws = p.ws ? ctx.workspace(p.ws) : nullptr;
    FANOUT_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p.w, wl.raw(), p.y, dyl.raw(), p.conv,
                                                    static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo), ws, p.ws,
                                                    &zero, p.x, dxl.raw()));
    if (low) store_output(ctx, dxl, *dx, p.channels_last);
  }
  if (dw.defined()) {
    Tensor xl = x, dwl = dw;
    const auto copies = [&](bool cl) {
      if (!low) return;
      dy_copy(cl);
      xl = low_operand(ctx, 0, x, cl);
      dwl = detail::low_buffer(ctx, 2, low_shape(w.shape(), cl));
    };
    // The timed search writes its output: give it a scratch dw (allocated
    // only when a plan is built in benchmark mode) so the real dw keeps its sum.
    Tensor scratch;
    const ConvPlan& p = get_plan<Dir::BackwardFilter>(ctx, h, s, [&](bool cl) {
      copies(cl);
      if (ctx.math.cudnn_benchmark) scratch = Tensor::empty(dwl.shape(), dwl.dtype(), ctx.device());
      return FindBuffers{xl.raw(), dyl.raw(), scratch.defined() ? scratch.raw() : nullptr};
    });
    copies(p.channels_last);
    void* ws = p.ws ? ctx.workspace(p.ws) : nullptr;
    FANOUT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, p.x, xl.raw(), p.y, dyl.raw(), p.conv,
                                                      static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo), ws, p.ws,
                                                      low ? &zero : &one, p.w, dwl.raw()));
    if (low) widen_back(ctx, dwl, dw, p.channels_last, true);
  }
  if (db) channel_bias_grad(ctx, dy, *db);
}

}  // namespace

bool conv_rounds_in_low_type(const Context& ctx) { return ctx.math.autocast != DType::F32; }

void conv_forward(Context& ctx, int spatial, const Tensor& x, const Tensor& w, const Tensor* b,
                  const ConvGeometry& g, Tensor& y) {
  forward(spatial == 2 ? "conv2d_forward" : "conv3d_forward", ctx, x, w, b, g.stride, g.padding, y);
}

void conv_backward(Context& ctx, int spatial, const Tensor& x, const Tensor& w, const Tensor& dy,
                   const ConvGeometry& g, Tensor* dx, Tensor& dw, Tensor* db) {
  backward(spatial == 2 ? "conv2d_backward" : "conv3d_backward", ctx, x, w, dy, g.stride, g.padding, dx, dw, db);
}

void channel_bias_add(Context& ctx, Tensor& y, const Tensor& b) {
  const int64_t total = y.numel(), c = y.size(1), sp = total == 0 ? 0 : total / (y.size(0) * c);
  detail::with_storage(y.dtype(), [&](auto t) {
    using T = decltype(t);
    detail::launch_per_element(ctx, total, total, [&](auto tag, int blocks, cudaStream_t st) {
      using I = decltype(tag);
      add_bias_kernel<T, I><<<blocks, detail::kThreads, 0, st>>>(y.data<T>(), b.f32(), static_cast<I>(c),
                                                                 static_cast<I>(sp), static_cast<I>(total),
                                                                 y.channels_last());
    });
  });
}

void channel_bias_grad(Context& ctx, const Tensor& dy, Tensor& db) {
  const int64_t n = dy.size(0), c = dy.size(1), sp = dy.numel() / (n * c);
  detail::DeviceScope scope(ctx);
  detail::with_storage(dy.dtype(), [&](auto t) {
    using T = decltype(t);
    detail::channel_sum_add(ctx, dy.data<T>(), n, c, sp, dy.channels_last(), db.f32());
  });
}

}  // namespace fanout::kernels::cuda
