// CPU convolutions, 2-D and 3-D, forward and both backward passes, through
// oneDNN. float32 activations come NCHW / NCDHW or channels-last (the
// widened copies of low-type activations under autocast keep their format):
// a plan reorders each operand into the layout oneDNN's kernel for the
// shape prefers (blocked channels, usually) in the context's workspace and
// the result back, once per call, or binds it as it is where the layouts
// agree. Plans are made once per shape and storage and kept by the context.
//
// Split-invariant math, and float64 weight gradients, run the same kernels
// one image at a time on plans made for one image: an image's output, input
// gradient and weight-gradient contribution then do not depend on the batch
// it came in, and float64 gradients sum each image's float contribution.
//
// Under bf16 autocast, where oneDNN multiplies bfloat16 natively, the
// convolutions run in it as cuDNN's do (kernels::conv_rounds_in_low_type):
// operands of any storage rounded into bfloat16 channels-last as they are
// read (no copy for activations already stored so), float32 accumulation,
// y (after its bias), dx and dW's term rounded once; dW's term is added to
// the float32 dw as its reorder widens it. One call a pass: the terms'
// float32 sums are far inside the rounding that follows them.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/conv.h"
#include "kernels/conv_bias.h"
#include "kernels/cpu/gemm_low.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/onednn.h"
#include "runtime/core/error.h"

namespace fanout::kernels::cpu {

namespace {

using dnnl::memory;
namespace dn = onednn;

// One convolution call: full-batch dims, the images each primitive call
// takes (the batch, or 1), and the geometry.
struct Conv {
  memory::dims x, w, y;  // (N, C, spatial...), (OC, C, kernel...), (N, OC, spatial...)
  int64_t stride, pad;
  int64_t images;        // per primitive call
  int spatial() const { return static_cast<int>(x.size()) - 2; }
  int64_t batch() const { return x[0]; }
  memory::dims per_call(memory::dims d) const {
    d[0] = images;
    return d;
  }
  memory::dims strides() const { return memory::dims(spatial(), stride); }
  memory::dims pads() const { return memory::dims(spatial(), pad); }
};

Conv conv_of(const Tensor& x, const Tensor& w, const Tensor& y, int64_t stride, int64_t pad, bool per_image) {
  Conv c;
  c.x.assign(x.shape().d.begin(), x.shape().d.begin() + x.dim());
  c.w.assign(w.shape().d.begin(), w.shape().d.begin() + w.dim());
  c.y.assign(y.shape().d.begin(), y.shape().d.begin() + y.dim());
  c.stride = stride;
  c.pad = pad;
  c.images = per_image ? 1 : c.x[0];
  return c;
}

// What a plan is made for: the pass (kForward, kBackward), the flags naming
// its inputs and outputs, the shapes and the threads.
dn::Key key_of(const Conv& c, int64_t pass, int64_t flags, int threads) {
  dn::Key k;
  k << pass << flags << c.spatial() << c.images << threads << c.stride << c.pad;
  for (int64_t v : c.x) k << v;
  for (int64_t v : c.w) k << v;
  return k;
}

// One operand of a primitive: the user's plain tensor and, when the
// primitive wants another layout, its copy in the workspace and the reorder
// between them (user -> inner for inputs, inner -> user for outputs).
struct Operand {
  memory user, inner;
  dnnl::reorder reorder;
  bool converts = false;
  size_t at = 0;  // inner's offset in the workspace
};

Operand operand(dn::State& s, const memory::desc& plain, const memory::desc& want, bool input,
                dn::WorkspaceLayout& ws, bool accumulate = false) {
  Operand o;
  o.user = dn::unbound(plain, s.engine);
  o.converts = accumulate || want != plain;
  if (!o.converts) {
    o.inner = o.user;
    return o;
  }
  o.inner = dn::unbound(want, s.engine);
  o.at = ws.add(want.get_size());
  dnnl::primitive_attr attr;  // no scratchpad: float reorders between layouts need none
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);  // user += inner
    attr.set_post_ops(po);
  }
  o.reorder = input ? dnnl::reorder(dnnl::reorder::primitive_desc(s.engine, plain, s.engine, want, attr))
                    : dnnl::reorder(dnnl::reorder::primitive_desc(s.engine, want, s.engine, plain, attr));
  return o;
}

// Binds an input to the tensor's data and converts it; binds an output
// (converted by finish()).
void bind_input(dn::State& s, Operand& o, const void* data, char* ws) {
  dn::bind(o.user, data);
  if (!o.converts) return;
  dn::bind(o.inner, ws + o.at);
  dn::execute(s, o.reorder, {{DNNL_ARG_FROM, &o.user}, {DNNL_ARG_TO, &o.inner}});
}
void bind_output(Operand& o, void* data, char* ws) {
  dn::bind(o.user, data);
  if (o.converts) dn::bind(o.inner, ws + o.at);
}
void finish(dn::State& s, Operand& o) {
  if (o.converts) dn::execute(s, o.reorder, {{DNNL_ARG_FROM, &o.inner}, {DNNL_ARG_TO, &o.user}});
}

memory::data_type dnnl_type(DType t) {
  return t == DType::BF16 ? memory::data_type::bf16 : t == DType::F16 ? memory::data_type::f16 : memory::data_type::f32;
}

// Channels-last (NHWC, NDHWC) or plain, by rank.
memory::format_tag layout_tag(size_t rank, bool channels_last) {
  using tag = memory::format_tag;
  if (rank == 5) return channels_last ? tag::acdeb : tag::abcde;
  return channels_last ? tag::acdb : tag::abcd;
}

// A user tensor as it is stored, with dims d (one call's images).
memory::desc stored_desc(const memory::dims& d, const Tensor& t) {
  return memory::desc(d, dnnl_type(t.dtype()), layout_tag(d.size(), t.channels_last()));
}

// What a plan's key adds for a user tensor: its storage (type and format).
int64_t storage_code(const Tensor& t) { return static_cast<int64_t>(t.dtype()) * 2 + t.channels_last(); }

memory::desc any(const memory::dims& d) {
  return memory::desc(d, memory::data_type::f32, memory::format_tag::any);
}

// The layout of a convolution's activations inside its passes: oneDNN's
// choice (blocks of 16 channels), unless a channel count would leave its
// blocks part empty: input channels beyond a first layer's 1 to 3 (which
// oneDNN reads unblocked) or output channels not a multiple of 16 run
// channels-last (NHWC / NDHWC): faster there, forward, gradients and
// reorders together (bench/RESULTS.md, "Measurements behind kernel choices").
memory::desc activations(const Conv& c, const memory::dims& d) {
  const int64_t in = c.w[1], out = c.w[0];
  if ((in > 3 && in % 16 != 0) || out % 16 != 0)
    return memory::desc(d, memory::data_type::f32,
                        d.size() == 5 ? memory::format_tag::acdeb : memory::format_tag::acdb);
  return any(d);
}

dnnl::convolution_forward::primitive_desc forward_pd(dn::State& s, const Conv& c, bool bias) {
  const memory::desc b = bias ? dn::plain({c.w[0]}) : memory::desc();
  return dn::make_pd<dnnl::convolution_forward>(s.engine, dn::user_scratchpad(), dnnl::prop_kind::forward_training,
                                                dnnl::algorithm::convolution_direct, activations(c, c.per_call(c.x)), any(c.w),
                                                b, activations(c, c.per_call(c.y)), c.strides(), c.pads(), c.pads());
}

struct ForwardPlan : dn::Plan {
  dnnl::convolution_forward prim;
  Operand x, w, y;
  memory b, scratch;
  size_t scratch_at = 0, bytes = 0;
};

struct DataPlan : dn::Plan {
  dnnl::convolution_backward_data prim;
  Operand dy, w, dx;
  memory scratch;
  size_t scratch_at = 0, bytes = 0;
};

struct WeightsPlan : dn::Plan {
  dnnl::convolution_backward_weights prim;
  Operand x, dy, dw;
  memory db, scratch;  // db: empty without a bias gradient
  size_t scratch_at = 0, db_at = 0, part_at = 0, bytes = 0;
};

enum : int64_t { kForward = dn::kConvForward, kData = dn::kConvBackwardData, kWeights = dn::kConvBackwardWeights };

// A forward plan of pd over user tensors stored as x_user and y_user (the
// weights plain float32).
std::unique_ptr<ForwardPlan> forward_plan(dn::State& s, const dnnl::convolution_forward::primitive_desc& pd,
                                          const memory::desc& x_user, const memory::desc& w_user,
                                          const memory::desc& y_user, bool bias) {
  auto q = std::make_unique<ForwardPlan>();
  dn::WorkspaceLayout ws;
  q->x = operand(s, x_user, pd.src_desc(), true, ws);
  q->w = operand(s, w_user, pd.weights_desc(), true, ws);
  q->y = operand(s, y_user, pd.dst_desc(), false, ws);
  if (bias) q->b = dn::unbound(pd.bias_desc(), s.engine);
  q->scratch = dn::unbound(pd.scratchpad_desc(), s.engine);
  q->scratch_at = ws.add(pd.scratchpad_desc().get_size());
  q->bytes = ws.bytes;
  q->prim = dnnl::convolution_forward(pd);
  return q;
}

// One call of p on its bound operands (the bias when the plan has one), y finished.
void run_forward(dn::State& s, ForwardPlan& p) {
  if (p.b)
    dn::execute(s, p.prim, {{DNNL_ARG_SRC, &p.x.inner}, {DNNL_ARG_WEIGHTS, &p.w.inner}, {DNNL_ARG_BIAS, &p.b},
                            {DNNL_ARG_DST, &p.y.inner}, {DNNL_ARG_SCRATCHPAD, &p.scratch}});
  else
    dn::execute(s, p.prim, {{DNNL_ARG_SRC, &p.x.inner}, {DNNL_ARG_WEIGHTS, &p.w.inner}, {DNNL_ARG_DST, &p.y.inner},
                            {DNNL_ARG_SCRATCHPAD, &p.scratch}});
  finish(s, p.y);
}

// The input-gradient plan of pd over user tensors stored as dy_user and dx_user.
std::unique_ptr<DataPlan> data_plan(dn::State& s, const dnnl::convolution_backward_data::primitive_desc& pd,
                                    const memory::desc& dy_user, const memory::desc& w_user,
                                    const memory::desc& dx_user) {
  auto q = std::make_unique<DataPlan>();
  dn::WorkspaceLayout ws;
  q->dy = operand(s, dy_user, pd.diff_dst_desc(), true, ws);
  q->w = operand(s, w_user, pd.weights_desc(), true, ws);
  q->dx = operand(s, dx_user, pd.diff_src_desc(), false, ws);
  q->scratch = dn::unbound(pd.scratchpad_desc(), s.engine);
  q->scratch_at = ws.add(pd.scratchpad_desc().get_size());
  q->bytes = ws.bytes;
  q->prim = dnnl::convolution_backward_data(pd);
  return q;
}

void run_data(dn::State& s, DataPlan& p) {
  dn::execute(s, p.prim, {{DNNL_ARG_DIFF_DST, &p.dy.inner}, {DNNL_ARG_WEIGHTS, &p.w.inner},
                          {DNNL_ARG_DIFF_SRC, &p.dx.inner}, {DNNL_ARG_SCRATCHPAD, &p.scratch}});
  finish(s, p.dx);
}

// y (=) for x, w, bias.
void forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, int64_t stride, int64_t pad,
             Tensor& y) {
  const Conv c = conv_of(x, w, y, stride, pad, ctx.math.split_invariant);
  if (c.batch() == 0) return;
  dn::State& s = dn::state(ctx);
  dn::Key key = key_of(c, kForward, b != nullptr, onednn_threads(ctx));
  key << storage_code(x) << storage_code(y);
  ForwardPlan& p = s.plan<ForwardPlan>(key, [&] {
    return forward_plan(s, forward_pd(s, c, b != nullptr), stored_desc(c.per_call(c.x), x), dn::plain(c.w),
                        stored_desc(c.per_call(c.y), y), b != nullptr);
  });
  char* ws = static_cast<char*>(ctx.workspace(p.bytes));
  dn::bind(p.scratch, ws + p.scratch_at);
  bind_input(s, p.w, w.f32(), ws);
  if (b) dn::bind(p.b, b->f32());
  const int64_t xs = x.numel() / c.batch() * c.images, ys = y.numel() / c.batch() * c.images;
  for (int64_t k = 0; k * c.images < c.batch(); ++k) {
    bind_input(s, p.x, x.f32() + k * xs, ws);
    bind_output(p.y, y.f32() + k * ys, ws);
    run_forward(s, p);
  }
}

// dx (=).
void backward_data(Context& ctx, const Tensor& w, const Tensor& dy, const Conv& c, Tensor& dx) {
  dn::State& s = dn::state(ctx);
  dn::Key key = key_of(c, kData, 0, onednn_threads(ctx));
  key << storage_code(dy) << storage_code(dx);
  DataPlan& p = s.plan<DataPlan>(key, [&] {
    const auto pd = dn::make_backward_pd<dnnl::convolution_backward_data>(
        s.engine, dn::user_scratchpad(), forward_pd(s, c, false), dnnl::algorithm::convolution_direct,
        activations(c, c.per_call(c.x)), any(c.w), activations(c, c.per_call(c.y)), c.strides(), c.pads(), c.pads());
    return data_plan(s, pd, stored_desc(c.per_call(c.y), dy), dn::plain(c.w), stored_desc(c.per_call(c.x), dx));
  });
  char* ws = static_cast<char*>(ctx.workspace(p.bytes));
  dn::bind(p.scratch, ws + p.scratch_at);
  bind_input(s, p.w, w.f32(), ws);
  const int64_t xs = dx.numel() / c.batch() * c.images, ys = dy.numel() / c.batch() * c.images;
  for (int64_t k = 0; k * c.images < c.batch(); ++k) {
    bind_input(s, p.dy, dy.f32() + k * ys, ws);
    bind_output(p.dx, dx.f32() + k * xs, ws);
    run_data(s, p);
  }
}

// The longest sum one weights-gradient call may take per element (images x
// output positions). oneDNN's kernels add a call's terms one after another
// in float, whose error grows with the count; longer batches are cut into
// calls of at most this many terms (at least one image) whose results are
// added in double: about a quarter of the error against float64, for a
// tenth of lenet's step at batch 256 and nothing measurable on larger nets
// (bench/RESULTS.md, "Measurements behind kernel choices").
constexpr int64_t kMaxSumTerms = 4096;

dnnl::convolution_backward_weights::primitive_desc weights_pd(dn::State& s, const Conv& c, bool bias) {
  const memory::desc b = bias ? dn::plain({c.w[0]}) : memory::desc();
  return dn::make_backward_pd<dnnl::convolution_backward_weights>(
      s.engine, dn::user_scratchpad(), forward_pd(s, c, bias), dnnl::algorithm::convolution_direct,
      activations(c, c.per_call(c.x)), any(c.w), b, activations(c, c.per_call(c.y)), c.strides(), c.pads(), c.pads());
}

// The weights-gradient plan for calls of c.images images of x and dy (as
// stored). `direct`: one call whose float32 result is added to dw by its
// reorder; otherwise each call's result lands in plain floats (dw_part,
// db_part) for the caller to add.
WeightsPlan& weights_plan(Context& ctx, const Conv& c, const Tensor& x, const Tensor& dy, bool want_dw, bool bias,
                          bool direct) {
  dn::State& s = dn::state(ctx);
  const int64_t flags = want_dw | bias << 1 | direct << 2;
  dn::Key key = key_of(c, kWeights, flags, onednn_threads(ctx));
  key << storage_code(x) << storage_code(dy);
  return s.plan<WeightsPlan>(key, [&] {
    auto q = std::make_unique<WeightsPlan>();
    const auto pd = weights_pd(s, c, bias);
    dn::WorkspaceLayout ws;
    q->x = operand(s, stored_desc(c.per_call(c.x), x), pd.src_desc(), true, ws);
    q->dy = operand(s, stored_desc(c.per_call(c.y), dy), pd.diff_dst_desc(), true, ws);
    q->dw = operand(s, dn::plain(c.w), pd.diff_weights_desc(), false, ws, direct);
    q->part_at = ws.add(dn::plain(c.w).get_size());
    if (bias) {
      q->db = dn::unbound(pd.diff_bias_desc(), s.engine);
      q->db_at = ws.add(pd.diff_bias_desc().get_size());
    }
    q->scratch = dn::unbound(pd.scratchpad_desc(), s.engine);
    q->scratch_at = ws.add(pd.scratchpad_desc().get_size());
    q->bytes = ws.bytes;
    q->prim = dnnl::convolution_backward_weights(pd);
    return q;
  });
}

// Runs p on images [first, first + c.images) of x and dy; the results as
// weights_plan says. `ws` is the workspace, at least p.bytes.
void run_weights(dn::State& s, WeightsPlan& p, const Conv& c, const Tensor& x, const Tensor& dy, int64_t first,
                 float* direct_dw, char* ws) {
  dn::bind(p.scratch, ws + p.scratch_at);
  bind_input(s, p.x, x.f32() + first * (x.numel() / c.batch()), ws);
  bind_input(s, p.dy, dy.f32() + first * (dy.numel() / c.batch()), ws);
  bind_output(p.dw, direct_dw ? direct_dw : reinterpret_cast<float*>(ws + p.part_at), ws);
  if (p.db) {
    dn::bind(p.db, ws + p.db_at);
    dn::execute(s, p.prim, {{DNNL_ARG_SRC, &p.x.inner}, {DNNL_ARG_DIFF_DST, &p.dy.inner},
                            {DNNL_ARG_DIFF_WEIGHTS, &p.dw.inner}, {DNNL_ARG_DIFF_BIAS, &p.db},
                            {DNNL_ARG_SCRATCHPAD, &p.scratch}});
  } else {
    dn::execute(s, p.prim, {{DNNL_ARG_SRC, &p.x.inner}, {DNNL_ARG_DIFF_DST, &p.dy.inner},
                            {DNNL_ARG_DIFF_WEIGHTS, &p.dw.inner}, {DNNL_ARG_SCRATCHPAD, &p.scratch}});
  }
  finish(s, p.dw);
}

// 3-D weight gradients as sums of 2-D ones. oneDNN 2.6 has no JIT kernel
// for a 3-D weight gradient on AVX2 (its gemm-based one copies im2col
// columns in scalar loops) but has one in 2-D: kernel depth kd's part of
// the 3-D gradient is the 2-D gradient over depth slices (x at depth
// d * stride - pad + kd with dy at depth d), and on channels-last copies the
// slices of one image lie at a constant stride, so each (image, kd) is 2-D
// calls over runs of consecutive slices. Chosen per shape where the 3-D
// kernel is gemm-based and the 2-D one generated(): 1.7-5.2x faster there
// (bench/RESULTS.md, "3-D weight gradients by depth slices").

// Whether oneDNN's implementation is a kernel generated for the shape
// (jit:avx2, brgconv, ...), not the gemm-based or reference one.
bool generated(const std::string& impl) {
  return impl.find("gemm") == std::string::npos && impl.rfind("ref", 0) != 0;
}

// One image's x and dy in channels-last copies.
struct ImagePlan : dn::Plan {
  Operand x, dy;
  size_t bytes = 0;
};

// The 2-D weight gradient over `slices` depth slices of one image's copies.
struct SlicePlan : dn::Plan {
  dnnl::convolution_backward_weights prim;
  memory x, dy, scratch;
  Operand dw;  // into a plain (OC, IC, KH, KW) part
  size_t scratch_at = 0, part_at = 0, bytes = 0;
  bool generated_kernel = false;  // oneDNN's kernel for it is generated(), not gemm-based or reference
};

struct Choice : dn::Plan {
  bool sliced = false;
};

memory::dims tail2(const memory::dims& d, int64_t first) { return {first, d[1], d[3], d[4]}; }

// c for `images` images a call, keyed apart from the batch (plans per image serve every batch size).
Conv per_image(const Conv& c, int64_t images) {
  Conv k = c;
  k.x[0] = k.y[0] = 1;
  k.images = images;
  return k;
}

dnnl::convolution_backward_weights::primitive_desc slice_pd(dn::State& s, const Conv& c, int64_t slices) {
  const memory::dims xd = tail2(c.x, slices), yd = tail2(c.y, slices), wd = {c.w[0], c.w[1], c.w[3], c.w[4]};
  const int64_t ic = c.x[1], h = c.x[3], w = c.x[4];
  const memory::desc x(xd, memory::data_type::f32, memory::dims{c.stride * h * w * ic, 1, w * ic, ic});
  const memory::desc y(yd, memory::data_type::f32, memory::format_tag::acdb);
  const memory::dims st(2, c.stride), pad(2, c.pad);
  const auto hint = dn::make_pd<dnnl::convolution_forward>(s.engine, dn::user_scratchpad(), dnnl::prop_kind::forward_training,
                                                           dnnl::algorithm::convolution_direct, x, any(wd),
                                                           memory::desc(), y, st, pad, pad);
  return dn::make_backward_pd<dnnl::convolution_backward_weights>(s.engine, dn::user_scratchpad(), hint,
                                                                  dnnl::algorithm::convolution_direct, x, any(wd),
                                                                  memory::desc(), y, st, pad, pad);
}

SlicePlan& slice_plan(Context& ctx, const Conv& c, int64_t slices) {
  dn::State& s = dn::state(ctx);
  return s.plan<SlicePlan>(key_of(per_image(c, slices), kWeights, 8, onednn_threads(ctx)), [&] {
    auto q = std::make_unique<SlicePlan>();
    const auto pd = slice_pd(s, c, slices);
    q->generated_kernel = generated(pd.impl_info_str());
    dn::WorkspaceLayout ws;
    q->x = dn::unbound(pd.src_desc(), s.engine);
    q->dy = dn::unbound(pd.diff_dst_desc(), s.engine);
    q->dw = operand(s, dn::plain({c.w[0], c.w[1], c.w[3], c.w[4]}), pd.diff_weights_desc(), false, ws);
    q->part_at = ws.add(c.w[0] * c.w[1] * c.w[3] * c.w[4] * sizeof(float));
    q->scratch = dn::unbound(pd.scratchpad_desc(), s.engine);
    q->scratch_at = ws.add(pd.scratchpad_desc().get_size());
    q->bytes = ws.bytes;
    q->prim = dnnl::convolution_backward_weights(pd);
    return q;
  });
}

// Slices of one output image per 2-D call: at most kMaxSumTerms terms.
int64_t slices_per_call(const Conv& c) { return std::max<int64_t>(1, kMaxSumTerms / (c.y[3] * c.y[4])); }

// Output depths [lo, hi) whose input depth for kernel depth kd lies inside the volume.
void depth_range(const Conv& c, int64_t kd, int64_t& lo, int64_t& hi) {
  const auto floor_div = [](int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
  lo = std::max<int64_t>(0, -floor_div(kd - c.pad, c.stride));
  hi = std::min<int64_t>(c.y[2], floor_div(c.x[2] - 1 + c.pad - kd, c.stride) + 1);
}

// FANOUT_CONV3D_WEIGHT_SLICES: `auto` (the default: by the kernels oneDNN
// picks), `always` or `never`; read on every call, so that tests run both
// paths on any CPU.
enum class Slices { kAuto, kAlways, kNever };
Slices slices_setting() {
  const char* v = std::getenv("FANOUT_CONV3D_WEIGHT_SLICES");
  const std::string setting = v ? v : "auto";
  FANOUT_USER_CHECK(setting == "auto" || setting == "always" || setting == "never")
      << "FANOUT_CONV3D_WEIGHT_SLICES must be auto, always or never, not '" << setting << "'";
  return setting == "always" ? Slices::kAlways : setting == "never" ? Slices::kNever : Slices::kAuto;
}

// Whether c's weight gradient runs as 2-D slices: the 3-D kernel is not
// generated() and the 2-D kernel for a full call is. Decided once per shape.
bool sliced_wins(Context& ctx, const Conv& c) {
  if (c.spatial() != 3) return false;
  if (const Slices setting = slices_setting(); setting != Slices::kAuto) return setting == Slices::kAlways;
  dn::State& s = dn::state(ctx);
  const Conv k = per_image(c, 1);
  return s.plan<Choice>(key_of(k, kWeights, 16, onednn_threads(ctx)), [&] {
           auto q = std::make_unique<Choice>();
           const bool generated3 = generated(weights_pd(s, k, false).impl_info_str());
           int64_t lo = 0, hi = 0;
           depth_range(c, std::min(c.pad, c.w[2] - 1), lo, hi);  // a kernel depth with a full run
           q->sliced = !generated3 && hi > lo && slice_plan(ctx, c, std::min(hi - lo, slices_per_call(c))).generated_kernel;
           return q;
         }).sliced;
}

// The runs of slices for kernel depth kd: (first output depth, count) each.
template <class F>
void each_run(const Conv& c, int64_t kd, F&& f) {
  int64_t lo = 0, hi = 0;
  depth_range(c, kd, lo, hi);
  for (int64_t d = lo; d < hi; d += slices_per_call(c)) f(d, std::min(slices_per_call(c), hi - d));
}

ImagePlan& image_plan(Context& ctx, const Conv& c, const Tensor& x, const Tensor& dy) {
  dn::State& s = dn::state(ctx);
  const Conv k = per_image(c, 1);
  dn::Key key = key_of(k, kWeights, 32, onednn_threads(ctx));
  key << storage_code(x) << storage_code(dy);
  return s.plan<ImagePlan>(key, [&] {
    auto q = std::make_unique<ImagePlan>();
    dn::WorkspaceLayout ws;
    const auto last = [](const memory::dims& d) { return memory::desc(d, memory::data_type::f32, memory::format_tag::acdeb); };
    q->x = operand(s, stored_desc(k.per_call(k.x), x), last(k.per_call(k.x)), true, ws);
    q->dy = operand(s, stored_desc(k.per_call(k.y), dy), last(k.per_call(k.y)), true, ws);
    q->bytes = ws.bytes;
    return q;
  });
}

// dw (+=), db (+=) when non-null, as backward_weights() says, by 2-D slices.
void sliced_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Conv& c, Tensor& dw, Tensor* db,
                    bool exact) {
  dn::State& s = dn::state(ctx);
  const int64_t n = c.batch(), oc = c.w[0], ic = c.w[1], kds = c.w[2], taps = c.w[3] * c.w[4];
  const int64_t wn = oc * ic * kds * taps, xs = x.numel() / n, ys = dy.numel() / n, plane_y = c.y[3] * c.y[4];
  ImagePlan& ip = image_plan(ctx, c, x, dy);
  size_t plan_bytes = 0;  // the largest slice plan's
  for (int64_t kd = 0; kd < kds; ++kd)
    each_run(c, kd, [&](int64_t, int64_t k) { plan_bytes = std::max(plan_bytes, slice_plan(ctx, c, k).bytes); });
  char* ws = static_cast<char*>(ctx.workspace(ip.bytes + plan_bytes + sizeof(double) * wn));
  char* pws = ws + ip.bytes;
  double* dw_sum = exact ? dw.f64() : reinterpret_cast<double*>(pws + plan_bytes);
  if (!exact) std::fill(dw_sum, dw_sum + wn, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    bind_input(s, ip.x, x.f32() + i * xs, ws);
    bind_input(s, ip.dy, dy.f32() + i * ys, ws);
    // The channels-last copies, or the image itself where one channel makes the layouts one.
    const float* xc = ip.x.converts ? reinterpret_cast<const float*>(ws + ip.x.at) : x.f32() + i * xs;
    const float* yc = ip.dy.converts ? reinterpret_cast<const float*>(ws + ip.dy.at) : dy.f32() + i * ys;
    for (int64_t kd = 0; kd < kds; ++kd)
      each_run(c, kd, [&](int64_t d, int64_t k) {
        SlicePlan& p = slice_plan(ctx, c, k);
        dn::bind(p.scratch, pws + p.scratch_at);
        dn::bind(p.x, xc + (d * c.stride - c.pad + kd) * c.x[3] * c.x[4] * ic);
        dn::bind(p.dy, yc + d * plane_y * oc);
        bind_output(p.dw, reinterpret_cast<float*>(pws + p.part_at), pws);
        dn::execute(s, p.prim, {{DNNL_ARG_SRC, &p.x}, {DNNL_ARG_DIFF_DST, &p.dy}, {DNNL_ARG_DIFF_WEIGHTS, &p.dw.inner},
                                {DNNL_ARG_SCRATCHPAD, &p.scratch}});
        finish(s, p.dw);
        const float* part = reinterpret_cast<const float*>(pws + p.part_at);
        for (int64_t o = 0; o < oc * ic; ++o)
          for (int64_t t = 0; t < taps; ++t) dw_sum[(o * kds + kd) * taps + t] += part[o * taps + t];
      });
  }
  if (db) channel_bias_grad(ctx, dy, *db);  // per image in double, as the kernels' float64 contract says
  if (!exact)
    for (int64_t j = 0; j < wn; ++j) dw.f32()[j] = static_cast<float>(dw.f32()[j] + dw_sum[j]);
}

// dw (+=) when defined, db (+=) when non-null. With float64 gradients
// (`exact`, c.images == 1) each image's float result is added to them in
// double; otherwise the batch is cut into calls of at most kMaxSumTerms
// terms, whose float results are summed in double and added once.
void backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, Conv c, Tensor& dw, Tensor* db,
                      bool exact) {
  const bool want_dw = dw.defined(), bias = db != nullptr;
  if (want_dw && sliced_wins(ctx, c)) return sliced_weights(ctx, x, dy, c, dw, db, exact);
  const int64_t n = c.batch(), oc = c.w[0];
  int64_t wn = 1;  // weight elements
  for (int64_t v : c.w) wn *= v;
  if (!exact) {
    int64_t positions = 1;  // output positions per image
    for (size_t a = 2; a < c.y.size(); ++a) positions *= c.y[a];
    const int64_t calls = (n * positions + kMaxSumTerms - 1) / kMaxSumTerms;
    c.images = (n + calls - 1) / calls;  // the last call may take fewer
  }
  const int64_t calls = (n + c.images - 1) / c.images, last = n - (calls - 1) * c.images;
  if (calls == 1 && want_dw && !exact) {  // one call: dw += through the reorder
    dn::State& s = dn::state(ctx);
    WeightsPlan& p = weights_plan(ctx, c, x, dy, true, bias, true);
    char* ws = static_cast<char*>(ctx.workspace(p.bytes));
    run_weights(s, p, c, x, dy, 0, dw.f32(), ws);
    const float* db_part = reinterpret_cast<const float*>(ws + p.db_at);
    if (bias)
      for (int64_t o = 0; o < oc; ++o) db->f32()[o] += db_part[o];
    return;
  }
  Conv tail = c;
  tail.images = last;
  dn::State& s = dn::state(ctx);
  WeightsPlan& p = weights_plan(ctx, c, x, dy, want_dw, bias, false);
  WeightsPlan& q = last == c.images ? p : weights_plan(ctx, tail, x, dy, want_dw, bias, false);
  // The double sums follow the plans' own buffers in the workspace; exact
  // mode adds into float64 dw and db themselves.
  const size_t plan_bytes = std::max(p.bytes, q.bytes);
  char* ws = static_cast<char*>(ctx.workspace(plan_bytes + sizeof(double) * (wn + oc)));
  double* dw_sum = exact ? (want_dw ? dw.f64() : nullptr) : reinterpret_cast<double*>(ws + plan_bytes);
  double* db_sum = exact ? (bias ? db->f64() : nullptr) : reinterpret_cast<double*>(ws + plan_bytes) + wn;
  if (!exact) std::fill(dw_sum, dw_sum + wn + oc, 0.0);
  for (int64_t k = 0; k < calls; ++k) {
    WeightsPlan& r = k + 1 < calls ? p : q;
    run_weights(s, r, k + 1 < calls ? c : tail, x, dy, k * c.images, nullptr, ws);
    const float* part = reinterpret_cast<const float*>(ws + r.part_at);
    const float* db_part = reinterpret_cast<const float*>(ws + r.db_at);
    if (want_dw)
      for (int64_t j = 0; j < wn; ++j) dw_sum[j] += part[j];
    if (bias)
      for (int64_t o = 0; o < oc; ++o) db_sum[o] += db_part[o];
  }
  if (exact) return;
  if (want_dw)
    for (int64_t j = 0; j < wn; ++j) dw.f32()[j] = static_cast<float>(dw.f32()[j] + dw_sum[j]);
  if (bias)
    for (int64_t o = 0; o < oc; ++o) db->f32()[o] = static_cast<float>(db->f32()[o] + db_sum[o]);
}

// dx (=) when non-null; dw (+=) when defined; db (+=) when non-null. float64
// dw and db take each image's float contribution.
void backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride, int64_t pad,
              Tensor* dx, Tensor& dw, Tensor* db) {
  const bool exact = (dw.defined() && dw.dtype() == DType::F64) || (db && db->dtype() == DType::F64);
  const Conv c = conv_of(x, w, dy, stride, pad, ctx.math.split_invariant || exact);
  if (c.batch() == 0) return;
  if (dx) backward_data(ctx, w, dy, c, *dx);
  if (dw.defined() || db) backward_weights(ctx, x, dy, c, dw, db, exact);
}


// ---- Low-type convolutions ----


// Activations inside the low passes: channels-last in the low type (what
// the layers store; oneDNN's bfloat16 kernels run on it as fast as on its
// blocked layouts, bench/RESULTS.md).
memory::desc low_activations(const memory::dims& d, DType lt) {
  return memory::desc(d, dnnl_type(lt), layout_tag(d.size(), true));
}
memory::desc low_any(const memory::dims& d, DType lt) { return memory::desc(d, dnnl_type(lt), memory::format_tag::any); }


dnnl::convolution_forward::primitive_desc low_forward_pd(dn::State& s, const Conv& c, DType lt, bool bias) {
  const memory::desc b = bias ? dn::plain({c.w[0]}) : memory::desc();
  return dn::make_pd<dnnl::convolution_forward>(s.engine, dn::user_scratchpad(), dnnl::prop_kind::forward_training,
                                                dnnl::algorithm::convolution_direct, low_activations(c.x, lt),
                                                low_any(c.w, lt), b, low_activations(c.y, lt), c.strides(), c.pads(),
                                                c.pads());
}

// y (=) for x, w and the bias, rounded once after the bias.
void low_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, int64_t stride, int64_t pad,
                 Tensor& y) {
  const Conv c = conv_of(x, w, y, stride, pad, false);
  if (c.batch() == 0) return;
  const DType lt = ctx.math.autocast;
  dn::State& s = dn::state(ctx);
  dn::Key key = key_of(c, dn::kConvLowForward, b != nullptr, onednn_threads(ctx));
  key << static_cast<int64_t>(lt) << storage_code(x) << storage_code(y);
  ForwardPlan& p = s.plan<ForwardPlan>(key, [&] {
    return forward_plan(s, low_forward_pd(s, c, lt, b != nullptr), stored_desc(c.x, x), dn::plain(c.w),
                        stored_desc(c.y, y), b != nullptr);
  });
  char* ws = static_cast<char*>(ctx.workspace(p.bytes));
  dn::bind(p.scratch, ws + p.scratch_at);
  bind_input(s, p.w, w.f32(), ws);
  bind_input(s, p.x, x.raw(), ws);
  bind_output(p.y, y.raw(), ws);
  if (b) dn::bind(p.b, b->f32());
  run_forward(s, p);
}

// dx (=), rounded.
void low_backward_data(Context& ctx, const Tensor& w, const Tensor& dy, const Conv& c, Tensor& dx) {
  const DType lt = ctx.math.autocast;
  dn::State& s = dn::state(ctx);
  dn::Key key = key_of(c, dn::kConvLowBackwardData, 0, onednn_threads(ctx));
  key << static_cast<int64_t>(lt) << storage_code(dy) << storage_code(dx);
  DataPlan& p = s.plan<DataPlan>(key, [&] {
    const auto pd = dn::make_backward_pd<dnnl::convolution_backward_data>(
        s.engine, dn::user_scratchpad(), low_forward_pd(s, c, lt, false), dnnl::algorithm::convolution_direct,
        low_activations(c.x, lt), low_any(c.w, lt), low_activations(c.y, lt), c.strides(), c.pads(), c.pads());
    return data_plan(s, pd, stored_desc(c.y, dy), dn::plain(c.w), stored_desc(c.x, dx));
  });
  char* ws = static_cast<char*>(ctx.workspace(p.bytes));
  dn::bind(p.scratch, ws + p.scratch_at);
  bind_input(s, p.w, w.f32(), ws);
  bind_input(s, p.dy, dy.raw(), ws);
  bind_output(p.dx, dx.raw(), ws);
  run_data(s, p);
}

// db (+=) summed from dy as given (kernels::channel_bias_grad, as CUDA sums
// it), when non-null; dw (+=) the term rounded to the low type, when
// defined: widened and added by its reorder, or, into float64 dw, added in
// double.
void low_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Conv& c, Tensor& dw, Tensor* db) {
  if (db) kernels::channel_bias_grad(ctx, dy, *db);
  if (!dw.defined()) return;
  const DType lt = ctx.math.autocast;
  const bool exact = dw.dtype() == DType::F64;
  dn::State& s = dn::state(ctx);
  dn::Key key = key_of(c, dn::kConvLowBackwardWeights, exact, onednn_threads(ctx));
  key << static_cast<int64_t>(lt) << storage_code(x) << storage_code(dy);
  WeightsPlan& p = s.plan<WeightsPlan>(key, [&] {
    auto q = std::make_unique<WeightsPlan>();
    const auto pd = dn::make_backward_pd<dnnl::convolution_backward_weights>(
        s.engine, dn::user_scratchpad(), low_forward_pd(s, c, lt, false), dnnl::algorithm::convolution_direct,
        low_activations(c.x, lt), low_any(c.w, lt), memory::desc(), low_activations(c.y, lt), c.strides(), c.pads(),
        c.pads());
    dn::WorkspaceLayout ws;
    q->x = operand(s, stored_desc(c.x, x), pd.src_desc(), true, ws);
    q->dy = operand(s, stored_desc(c.y, dy), pd.diff_dst_desc(), true, ws);
    // The low-type term through its reorder: added to float32 dw (user += inner), or widened into plain floats.
    q->dw = operand(s, dn::plain(c.w), pd.diff_weights_desc(), false, ws, /*accumulate=*/!exact);
    q->part_at = ws.add(dn::plain(c.w).get_size());
    q->scratch = dn::unbound(pd.scratchpad_desc(), s.engine);
    q->scratch_at = ws.add(pd.scratchpad_desc().get_size());
    q->bytes = ws.bytes;
    q->prim = dnnl::convolution_backward_weights(pd);
    return q;
  });
  char* ws = static_cast<char*>(ctx.workspace(p.bytes));
  dn::bind(p.scratch, ws + p.scratch_at);
  bind_input(s, p.x, x.raw(), ws);
  bind_input(s, p.dy, dy.raw(), ws);
  float* part = reinterpret_cast<float*>(ws + p.part_at);
  bind_output(p.dw, exact ? static_cast<void*>(part) : dw.raw(), ws);
  dn::execute(s, p.prim, {{DNNL_ARG_SRC, &p.x.inner}, {DNNL_ARG_DIFF_DST, &p.dy.inner},
                          {DNNL_ARG_DIFF_WEIGHTS, &p.dw.inner}, {DNNL_ARG_SCRATCHPAD, &p.scratch}});
  finish(s, p.dw);
  if (exact)
    for (int64_t j = 0; j < dw.numel(); ++j) dw.f64()[j] += part[j];
}

void low_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, int64_t stride, int64_t pad,
                  Tensor* dx, Tensor& dw, Tensor* db) {
  const Conv c = conv_of(x, w, dy, stride, pad, false);
  if (c.batch() == 0) return;
  if (dx) low_backward_data(ctx, w, dy, c, *dx);
  if (dw.defined() || db) low_backward_weights(ctx, x, dy, c, dw, db);
}

}  // namespace

namespace {
// Whether oneDNN runs bfloat16 convolutions, channels-last, with kernels
// generated for this CPU in all three passes (asked once, of a 3x3 one).
bool low_conv_native() {
  static const bool native = [] {
    try {
      dn::State s;
      Conv c;
      c.x = {2, 16, 8, 8};
      c.w = {16, 16, 3, 3};
      c.y = {2, 16, 8, 8};
      c.stride = c.pad = 1;
      c.images = 2;
      const DType lt = DType::BF16;
      const auto fwd = low_forward_pd(s, c, lt, false);
      const auto data = dn::make_backward_pd<dnnl::convolution_backward_data>(
          s.engine, dn::user_scratchpad(), fwd, dnnl::algorithm::convolution_direct, low_activations(c.x, lt),
          low_any(c.w, lt), low_activations(c.y, lt), c.strides(), c.pads(), c.pads());
      const auto weights = dn::make_backward_pd<dnnl::convolution_backward_weights>(
          s.engine, dn::user_scratchpad(), fwd, dnnl::algorithm::convolution_direct, low_activations(c.x, lt),
          low_any(c.w, lt), memory::desc(), low_activations(c.y, lt), c.strides(), c.pads(), c.pads());
      return generated(fwd.impl_info_str()) && generated(data.impl_info_str()) &&
             generated(weights.impl_info_str());
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}
}  // namespace

bool conv_rounds_in_low_type(const Context& ctx) {
  // bfloat16 only: oneDNN's float16 convolutions need CPUs (AVX-512 FP16)
  // whose support this code has not been run on.
  return ctx.math.autocast == DType::BF16 && !ctx.math.split_invariant && low_gemm_native(DType::BF16) &&
         low_conv_native();
}

void conv_forward(Context& ctx, int spatial, const Tensor& x, const Tensor& w, const Tensor* b,
                  const ConvGeometry& g, Tensor& y) {
  if (conv_rounds_in_low_type(ctx)) return low_forward(ctx, x, w, b, g.stride, g.padding, y);
  forward(ctx, x, w, b, g.stride, g.padding, y);
}

void conv_backward(Context& ctx, int spatial, const Tensor& x, const Tensor& w, const Tensor& dy,
                   const ConvGeometry& g, Tensor* dx, Tensor& dw, Tensor* db) {
  if (conv_rounds_in_low_type(ctx)) return low_backward(ctx, x, w, dy, g.stride, g.padding, dx, dw, db);
  backward(ctx, x, w, dy, g.stride, g.padding, dx, dw, db);
}

}  // namespace fanout::kernels::cpu
