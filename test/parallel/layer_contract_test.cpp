// The Module contract's check: a layer of the user's own with parameters
// whose backward forgets notify_grads_ready(ctx) is a one-line error naming
// it, on one device, under DataParallel (cpu:2) and under DDP (2 ranks) alike
// (before, DataParallel passed silently and DDP blamed the parameters as
// unused). The same layer that does notify trains in all three.
#include <gtest/gtest.h>

#include "runtime/core/error.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/sequential.h"
#include "runtime/parallel/engine_factory.h"
#include "support/dist_util.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

// y = x * s elementwise over the features, s (F) a parameter (CPU only).
class Scale : public Module {
 public:
  Scale(int64_t features, bool notify) : f_(features), notify_(notify) { s_ = &register_parameter("scale", Shape{features}); }
  void reset_parameters(std::mt19937_64&) override { s_->value.fill(1.5f); }
  Tensor forward(const Tensor& x, Context& ctx) override {
    x_ = x;
    ensure(y_, x.shape(), ctx.device());
    for (int64_t i = 0; i < x.numel(); ++i) y_.f32()[i] = x.f32()[i] * s_->value.f32()[i % f_];
    return y_;
  }
  Tensor backward(const Tensor& dy, Context& ctx) override {
    for (int64_t i = 0; i < dy.numel(); ++i) s_->grad.f32()[i % f_] += dy.f32()[i] * x_.f32()[i];
    if (notify_) notify_grads_ready(ctx);
    if (!input_grad()) return Tensor();
    for (int64_t i = 0; i < dy.numel(); ++i) dy.f32()[i] *= s_->value.f32()[i % f_];
    return dy;
  }
  std::unique_ptr<Module> make_like() const override { return std::make_unique<Scale>(f_, notify_); }
  std::string type_name() const override { return "Scale"; }

 private:
  int64_t f_;
  bool notify_;
  Parameter* s_;
  Tensor x_, y_;
};

std::unique_ptr<Module> net(bool notify) {
  auto m = std::make_unique<models::Sequential>();
  m->add("flatten", std::make_unique<models::Flatten>());
  m->add("scale", std::make_unique<Scale>(16, notify));
  m->add("fc", std::make_unique<models::Linear>(16, 3));
  m->init(2);
  return m;
}

// One step of `devices` (with a group of `world` ranks as threads when world > 1); the error text or "".
std::string step(const std::string& devices, int world, bool notify) {
  const auto data = testing::random_batches(Shape{1, 4, 4}, 8, 1, 3);
  for (auto& b : data)
    for (int64_t i = 0; i < b.y.numel(); ++i) b.y.data<int32_t>()[i] %= 3;
  std::vector<std::string> errors(world);
  testing::TempDir dir;
  testing::run_ranks(world, [&](int rank) {
    auto m = net(notify);
    EngineSpec spec = testing::engine_on(devices, false);
    if (world > 1) spec.group = distributed::make_gloo_group({rank, world, "file:" + dir.path(), "contract", 30});
    auto e = make_engine(*m, std::move(spec));
    try {
      const int64_t rows = data[0].x.size(0) / world;
      e->forward_backward(data[0].x.slice(rank * rows, (rank + 1) * rows),
                          data[0].y.slice(rank * rows, (rank + 1) * rows), 1.0f / 8, true);
    } catch (const Error& err) {
      errors[rank] = err.what();
    }
  });
  return errors[0];
}

TEST(LayerContract, ALayerThatNeverNotifiesIsNamedInEveryMode) {
  for (auto [devices, world] : {std::pair<const char*, int>{"cpu", 1}, {"cpu:2", 1}, {"cpu", 2}}) {
    SCOPED_TRACE(std::string(devices) + (world > 1 ? " DDP" : ""));
    const std::string err = step(devices, world, false);
    EXPECT_NE(err.find("layer 'scale' (Scale) has parameters but its backward did not call notify_grads_ready(ctx)"),
              std::string::npos)
        << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    EXPECT_EQ(step(devices, world, true), "") << "the same layer with the call trains";
  }
}

// A make_like() that builds another architecture (here: other features) is
// refused by name when DataParallel makes its replicas, not trained on.
class Forgetful : public Scale {
 public:
  using Scale::Scale;
  std::unique_ptr<Module> make_like() const override { return std::make_unique<Scale>(8, true); }
  std::string type_name() const override { return "Forgetful"; }
};

TEST(LayerContract, AMakeLikeOfAnotherArchitectureIsRefused) {
  Forgetful m(16, true);
  m.init(2);
  testing::expect_user_error([&] { make_engine(m, testing::engine_on("cpu:2", false)); },
                             {"Forgetful::make_like() made a module with other parameters or buffers"});
}

}  // namespace
}  // namespace fanout
