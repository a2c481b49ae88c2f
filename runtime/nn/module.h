// Module interface. A model is a tree of modules; its float parameters live in
// one flat arena per device and their gradients in another (Parameter tensors
// are views), float buffers (BatchNorm running statistics) in a third. Names
// follow torchvision (`layer1.0.bn1.running_mean`) so checkpoints map one to
// one onto PyTorch state_dicts.
//
// forward(x, ctx) keeps what backward needs; backward(dy, ctx) accumulates
// parameter gradients (+=) and returns dx (=), or an undefined tensor when
// the module was told its input needs no gradient. As autograd frees a
// gradient once used, backward may overwrite dy (in-place ReLU masks it):
// callers pass a gradient they do not read afterwards. In-place layers also
// overwrite their input in forward (ReLU(inplace), as torch's).
#pragma once
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout {

class BatchStatSync;

struct Parameter {
  std::string name;   // local name: "weight", "bias"
  Shape shape;
  Tensor value;       // view into the parameter arena
  Tensor grad;        // view into the gradient arena
  int64_t offset = 0; // first element in the arenas
};

struct Buffer {
  std::string name;  // "running_mean", "running_var", "num_batches_tracked"
  Shape shape;
  DType dtype = DType::F32;
  Tensor value;       // F32: view into the buffer arena; other dtypes: own host storage
  int64_t offset = 0; // F32 only
};

// The flat storage of a whole model on one device.
struct Arenas {
  Tensor params;   // (P) float32
  Tensor grads;    // (P) float32, or float64 (set_grad_dtype); a window of them with set_grad_window
  Tensor buffers;  // (B) float32
  int64_t grads_begin = 0;  // the parameter element grads[0] belongs to
  // Gradient elements [begin, begin + count) of the parameter arena, a view
  // into the window (a checked error outside it).
  Tensor grad_range(int64_t begin, int64_t count) const;
};

class Module {
 public:
  virtual ~Module() = default;
  Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& x, Context& ctx) = 0;
  virtual Tensor backward(const Tensor& dy, Context& ctx) = 0;
  // A new module of the same architecture and hyper-parameters, not yet materialized.
  virtual std::unique_ptr<Module> make_like() const = 0;
  virtual std::string type_name() const = 0;
  // Sets this module's own parameters and buffers to their initial values
  // (called on CPU, before the children's). Default: nothing to initialize.
  virtual void reset_parameters(std::mt19937_64& /*rng*/) {}
  // Called after the whole subtree's reset_parameters: a model that
  // initializes its tree by its own rule (nanoGPT's _init_weights) does it here.
  virtual void finish_init(std::mt19937_64& /*rng*/) {}
  // Whether backward must return dx. Containers forward this to their first child.
  virtual void set_input_grad(bool on) { input_grad_ = on; }
  bool input_grad() const { return input_grad_; }
  // Installs (or, with null, removes) a cross-replica statistics hook on
  // every layer of the subtree that normalizes over the batch.
  virtual void set_batch_stat_sync(BatchStatSync* s);
  // The hook installed in this subtree (the first layer's that has one), or null.
  virtual BatchStatSync* batch_stat_sync() const;
  // Whether this layer (not its children) normalizes over the batch in
  // training, so that a sample's output depends on the other samples.
  virtual bool normalizes_over_batch() const { return false; }

  // Parameters this module uses under a second name (weight tying: GPT's
  // lm_head.weight is transformer.wte.weight), as (alias, the parameter's
  // name), relative to this module. The parameter is one (one arena entry,
  // one gradient, one optimizer state, one name in state_dict()); loading a
  // state dict accepts it under either name, as PyTorch's safetensors
  // load_model does.
  virtual std::vector<std::pair<std::string, std::string>> tied_names() const { return {}; }

  // Rewrites weights saved in another library's layout of this model (names,
  // transposed matrices, buffers it does not keep) into its own, before
  // train::load_weights loads them; leaves its own layout alone. One-line
  // errors for a layout it recognizes but cannot take.
  virtual void adapt_state_dict(std::vector<std::pair<std::string, Tensor>>& /*tensors*/) const {}

  // Training flag for the whole subtree (BatchNorm reads it).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // How many modules this process has constructed (tests prove the steady-state step builds none).
  static uint64_t constructed();

  // --- tree-wide (call on the root) ---
  // Lays out and allocates the arenas on `d`, zeroes them, and binds every
  // Parameter and Buffer to its view. Initialization is separate (init()).
  void materialize(Device d);
  // Materializes on CPU and initializes with a seeded RNG, as PyTorch would for this architecture.
  void init(uint64_t seed);
  // Moves the arenas to another device (copy), rebinding all views.
  void to(Device d, Stream* s = nullptr);
  // A deep copy on `d`: same architecture, values and training flag.
  std::unique_ptr<Module> clone(Device d, Stream* s = nullptr) const;
  // Binds this module's parameters to `from`'s parameter arena, in place (a
  // module of the same architecture whose arena is in memory this one's
  // device reads: a CPU replica reading the primary's parameters). Its
  // gradients and buffers stay its own.
  void share_params(const Module& from);
  bool shares_params_with(const Module& from) const;

  bool materialized() const { return arenas_ != nullptr; }
  Device device() const;
  Arenas& arenas();
  const Arenas& arenas() const;
  int64_t num_parameters() const;  // elements, without alignment padding

  void zero_grad(Stream* s = nullptr);
  // Reallocates the gradient arena (zeroed) in `t`: F32 (default) or F64.
  // F64 gradients hold exact sums of per-sample float contributions, so
  // their value does not depend on the order samples and replicas are added
  // in; the optimizer rounds them to float once. CPU devices only.
  void set_grad_dtype(DType t);
  DType grad_dtype() const { return arenas().grads.dtype(); }
  // ZeRO-2: the gradient arena becomes the window [begin, end) of the
  // parameter arena (zeroed, in the same dtype). Parameters wholly inside
  // keep their gradient views there; the others have none (an undefined
  // tensor) until an engine binds one for a pass (Context::on_grad_write).
  void set_grad_window(int64_t begin, int64_t end);

  std::vector<std::pair<std::string, Parameter*>> named_parameters();
  std::vector<std::pair<std::string, Buffer*>> named_buffers();
  // Parameters and buffers interleaved per module, as torch's state_dict orders them.
  std::vector<std::pair<std::string, Tensor>> state_dict();
  std::vector<std::pair<std::string, Module*>> named_modules();

  // m.backward(dy, ctx), checking the contract every caller relies on: a
  // module with parameters of its own calls notify_grads_ready(ctx) in
  // backward. One that does not is a one-line error naming it (`name`: its
  // name in its parent). Containers and engines call children this way.
  static Tensor backward_of(Module& m, const std::string& name, const Tensor& dy, Context& ctx);

 protected:
  Parameter& register_parameter(const std::string& name, const Shape& s);
  Buffer& register_buffer(const std::string& name, const Shape& s, DType t = DType::F32);
  // An empty name adds no level to the names below it (Checkpointed's block).
  template <class M>
  M& register_module(const std::string& name, std::unique_ptr<M> m) {
    M& ref = *m;
    children_.emplace_back(name, std::move(m));
    return ref;
  }
  std::vector<std::pair<std::string, std::unique_ptr<Module>>>& children() { return children_; }
  const std::vector<std::pair<std::string, std::unique_ptr<Module>>>& children() const { return children_; }
  std::deque<Parameter>& params() { return params_; }
  std::deque<Buffer>& buffers() { return buffers_; }

  // Reports this module's own parameter gradients as final (one contiguous range).
  void notify_grads_ready(Context& ctx) const;

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Parameter*>>* ps,
               std::vector<std::pair<std::string, Buffer*>>* bs, std::vector<std::pair<std::string, Tensor>>* sd,
               std::vector<std::pair<std::string, Module*>>* ms);
  void bind(const std::shared_ptr<Arenas>& a);
  void init_tree(std::mt19937_64& rng);

  std::deque<Parameter> params_;  // deque: references stay valid
  mutable bool notified_ = false;  // notify_grads_ready ran since backward_of began
  std::deque<Buffer> buffers_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  std::shared_ptr<Arenas> arenas_;  // shared by every module of one tree
  bool training_ = true;
  bool input_grad_ = true;
};

// Elements each parameter's offset is aligned to in the arenas (64 bytes).
inline constexpr int64_t kArenaAlign = 16;

}  // namespace fanout
