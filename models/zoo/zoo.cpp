// Model zoo builders.
#include "models/zoo/zoo.h"

#include "models/layers/activation.h"
#include "models/layers/basic_block.h"
#include "models/layers/batchnorm.h"
#include "models/layers/checkpointed.h"
#include "models/layers/conv.h"
#include "models/layers/flatten.h"
#include "models/layers/groupnorm.h"
#include "models/layers/linear.h"
#include "models/layers/pooling.h"
#include "models/layers/upsample.h"
#include "models/zoo/gpt.h"
#include "models/layers/sequential.h"
#include "runtime/core/error.h"

namespace fanout::models {

namespace {
void check_image_input(const std::string& model, const Shape& in, int64_t min_hw) {
  FANOUT_USER_CHECK(in.ndim == 3 && in[0] >= 1 && in[1] >= min_hw && in[2] >= min_hw)
      << "model " << model << " cannot take images of shape " << in.str() << " (needs (C, H, W) with H, W >= "
      << min_hw << ")";
}
int64_t conv_out(int64_t x, int64_t k, int64_t s, int64_t p) { return (x + 2 * p - k) / s + 1; }
}  // namespace

std::unique_ptr<Module> mlp(const Shape& in, int classes) {
  FANOUT_USER_CHECK(in.ndim >= 1 && in.numel() > 0) << "model mlp cannot take inputs of shape " << in.str();
  auto m = std::make_unique<Sequential>();
  m->add("flatten", std::make_unique<Flatten>());
  m->add("fc1", std::make_unique<Linear>(in.numel(), 512));
  m->add("relu1", std::make_unique<ReLU>(/*inplace=*/true));
  m->add("fc2", std::make_unique<Linear>(512, 256));
  m->add("relu2", std::make_unique<ReLU>(/*inplace=*/true));
  m->add("fc3", std::make_unique<Linear>(256, classes));
  return m;
}

std::unique_ptr<Module> lenet(const Shape& in, int classes) {
  check_image_input("lenet", in, 28);
  const int64_t pad = in[1] < 32 ? (32 - in[1] + 1) / 2 : 0;
  const int64_t h = conv_out(conv_out(conv_out(conv_out(in[1], 5, 1, pad), 2, 2, 0), 5, 1, 0), 2, 2, 0);
  const int64_t w = conv_out(conv_out(conv_out(conv_out(in[2], 5, 1, pad), 2, 2, 0), 5, 1, 0), 2, 2, 0);
  auto m = std::make_unique<Sequential>();
  m->add("conv1", std::make_unique<Conv2d>(in[0], 6, 5, 1, pad));
  m->add("relu1", std::make_unique<ReLU>(/*inplace=*/true));
  m->add("pool1", std::make_unique<MaxPool2d>(2, 2));
  m->add("conv2", std::make_unique<Conv2d>(6, 16, 5));
  m->add("relu2", std::make_unique<ReLU>(/*inplace=*/true));
  m->add("pool2", std::make_unique<MaxPool2d>(2, 2));
  m->add("flatten", std::make_unique<Flatten>());
  m->add("fc1", std::make_unique<Linear>(16 * h * w, 120));
  m->add("relu3", std::make_unique<ReLU>(/*inplace=*/true));
  m->add("fc2", std::make_unique<Linear>(120, 84));
  m->add("relu4", std::make_unique<ReLU>(/*inplace=*/true));
  m->add("fc3", std::make_unique<Linear>(84, classes));
  return m;
}

std::unique_ptr<Module> cnn(const Shape& in, int classes) {
  check_image_input("cnn", in, 8);
  auto m = std::make_unique<Sequential>();
  int64_t c = in[0], h = in[1], w = in[2];
  const int64_t widths[3] = {32, 64, 128};
  for (int i = 0; i < 3; ++i) {
    const std::string k = std::to_string(i + 1);
    m->add("conv" + k, std::make_unique<Conv2d>(c, widths[i], 3, 1, 1, false));
    m->add("bn" + k, std::make_unique<BatchNorm2d>(widths[i]));
    m->add("relu" + k, std::make_unique<ReLU>(/*inplace=*/true));
    m->add("pool" + k, std::make_unique<MaxPool2d>(2, 2));
    c = widths[i];
    h /= 2;
    w /= 2;
  }
  m->add("flatten", std::make_unique<Flatten>());
  m->add("fc1", std::make_unique<Linear>(c * h * w, 256));
  m->add("relu4", std::make_unique<ReLU>(/*inplace=*/true));
  m->add("fc2", std::make_unique<Linear>(256, classes));
  return m;
}

std::unique_ptr<Module> resnet18(const Shape& in, int classes, bool imagenet_stem, bool checkpoint) {
  check_image_input(imagenet_stem ? "resnet18:imagenet" : "resnet18", in, imagenet_stem ? 32 : 8);
  using I = Conv2d::Init;
  auto m = std::make_unique<Sequential>();
  if (imagenet_stem) {
    m->add("conv1", std::make_unique<Conv2d>(in[0], 64, 7, 2, 3, false, I::KaimingNormalFanOut));
  } else {
    m->add("conv1", std::make_unique<Conv2d>(in[0], 64, 3, 1, 1, false, I::KaimingNormalFanOut));
  }
  m->add("bn1", std::make_unique<BatchNorm2d>(64));
  m->add("relu", std::make_unique<ReLU>(/*inplace=*/true));
  if (imagenet_stem) m->add("maxpool", std::make_unique<MaxPool2d>(3, 2, 1));
  int64_t c = 64;
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int i = 0; i < 4; ++i) {
    auto layer = std::make_unique<Sequential>();
    const int64_t stride = i == 0 ? 1 : 2;
    layer->add(checkpointed_if(checkpoint, std::make_unique<BasicBlock>(c, widths[i], stride)));
    layer->add(checkpointed_if(checkpoint, std::make_unique<BasicBlock>(widths[i], widths[i], 1)));
    m->add("layer" + std::to_string(i + 1), std::move(layer));
    c = widths[i];
  }
  m->add("avgpool", std::make_unique<AdaptiveAvgPool2d>());
  m->add("flatten", std::make_unique<Flatten>());
  m->add("fc", std::make_unique<Linear>(512, classes));
  return m;
}

// heatmap3d:group's groups of channels per GroupNorm (widths 8, 16, 32: 2 to 8 channels a group).
constexpr int kHeatmapGroups = 4;

std::unique_ptr<Module> heatmap3d(const Shape& in, int landmarks, int64_t width, bool group_norm, bool checkpoint) {
  FANOUT_USER_CHECK(in.ndim == 4 && in[0] >= 1 && in[1] >= 8 && in[2] >= 8 && in[3] >= 8 && in[1] % 4 == 0 &&
                    in[2] % 4 == 0 && in[3] % 4 == 0)
      << "model heatmap3d cannot take inputs of shape " << in.str()
      << " (needs volumes (C, D, H, W) with D, H, W multiples of 4, at least 8)";
  FANOUT_USER_CHECK(landmarks >= 1) << "model heatmap3d needs at least 1 landmark, got " << landmarks;
  FANOUT_USER_CHECK(width >= 1) << "model heatmap3d needs a positive width, got " << width;
  FANOUT_USER_CHECK(!group_norm || width % kHeatmapGroups == 0)
      << "model heatmap3d:group needs a width that is a multiple of " << kHeatmapGroups << ", got " << width;
  auto m = std::make_unique<Sequential>();
  // A stage: conv-norm-ReLU and the pooling or upsampling after it. With
  // checkpointing each stage is one checkpointed block whose names add no level.
  auto stage = [&](const std::string& k, int64_t from, int64_t to, std::unique_ptr<Module> resample,
                   const std::string& resample_name) {
    std::unique_ptr<Sequential> own = checkpoint ? std::make_unique<Sequential>() : nullptr;
    Sequential& s = own ? *own : *m;
    s.add("conv" + k, std::make_unique<Conv3d>(from, to, 3, 1, 1, false));
    if (group_norm)
      s.add("gn" + k, std::make_unique<GroupNorm>(kHeatmapGroups, to));
    else
      s.add("bn" + k, std::make_unique<BatchNorm3d>(to));
    s.add("relu" + k, std::make_unique<ReLU>(/*inplace=*/true));
    if (resample) s.add(resample_name, std::move(resample));
    if (own) m->add("", std::make_unique<Checkpointed>(std::move(own)));
  };
  stage("1", in[0], width, std::make_unique<MaxPool3d>(2), "pool1");
  stage("2", width, 2 * width, std::make_unique<MaxPool3d>(2), "pool2");
  stage("3", 2 * width, 4 * width, std::make_unique<Upsample3d>(2), "up1");
  stage("4", 4 * width, 2 * width, std::make_unique<Upsample3d>(2), "up2");
  stage("5", 2 * width, width, nullptr, "");
  m->add("head", std::make_unique<Conv3d>(width, landmarks, 1));
  return m;
}

namespace {
// The zoo: one row per name, in the order model_names() lists them.
struct ZooEntry {
  const char* name;
  bool dense;  // heatmaps (one per landmark) rather than class scores
  bool blocks;  // has blocks that activation checkpointing wraps
  std::unique_ptr<Module> (*build)(const Shape& input, int classes, bool checkpoint);
};
constexpr ZooEntry kZoo[] = {
    {"mlp", false, false, [](const Shape& in, int c, bool) { return mlp(in, c); }},
    {"lenet", false, false, [](const Shape& in, int c, bool) { return lenet(in, c); }},
    {"cnn", false, false, [](const Shape& in, int c, bool) { return cnn(in, c); }},
    {"resnet18", false, true, [](const Shape& in, int c, bool k) { return resnet18(in, c, false, k); }},
    {"resnet18:imagenet", false, true, [](const Shape& in, int c, bool k) { return resnet18(in, c, true, k); }},
    {"heatmap3d", true, true, [](const Shape& in, int c, bool k) { return heatmap3d(in, c, 8, false, k); }},
    {"heatmap3d:group", true, true,
     [](const Shape& in, int c, bool k) { return heatmap3d(in, c, 8, /*group_norm=*/true, k); }},
};

const ZooEntry* find_entry(const std::string& name) {
  for (const ZooEntry& e : kZoo)
    if (name == e.name) return &e;
  return nullptr;
}

const ZooEntry& zoo_entry(const std::string& name) {
  if (const ZooEntry* e = find_entry(name)) return *e;
  std::string known;
  for (const std::string& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  FANOUT_FAIL() << "unknown model '" << name << "' (known: " << known << ")";
}
}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> out;
  for (const ZooEntry& e : kZoo) out.emplace_back(e.name);
  out.emplace_back("gpt[:PRESET][,KEY=VALUE...]");
  return out;
}

bool is_gpt(const std::string& name) { return name == "gpt" || name.rfind("gpt:", 0) == 0; }

void check_model_name(const std::string& name) {
  if (!is_gpt(name)) zoo_entry(name);
}

bool dense_output(const std::string& name) {
  const ZooEntry* e = find_entry(name);
  return e && e->dense;
}

std::unique_ptr<Module> make_model(const std::string& name, const Shape& input, int classes, uint64_t seed,
                                   bool checkpoint_activations) {
  if (is_gpt(name)) {
    const GPTConfig c = parse_gpt_config(gpt_spec(name), classes);
    FANOUT_USER_CHECK(input.ndim == 1 && input[0] >= 1)
        << "model gpt takes (T) token ids per sample, not samples of shape " << input.str();
    FANOUT_USER_CHECK(input[0] <= c.block_size)
        << "gpt: a sequence of " << input[0] << " tokens is longer than block_size " << c.block_size;
    FANOUT_USER_CHECK(classes <= c.vocab_size)
        << "gpt: the data has " << classes << " token ids, more than vocab_size " << c.vocab_size;
    return gpt(c, seed, checkpoint_activations);
  }
  const ZooEntry& entry = zoo_entry(name);
  FANOUT_USER_CHECK(entry.blocks || !checkpoint_activations)
      << "model " << name << " has no blocks to checkpoint (resnet18, heatmap3d and gpt have)";
  FANOUT_USER_CHECK(entry.dense || classes >= 2) << "a classifier needs at least 2 classes, got " << classes;
  std::unique_ptr<Module> m = entry.build(input, classes, checkpoint_activations);
  // Layer ids let SyncBatchNorm match the same layer across replicas.
  int id = 0;
  for (auto& [n, mod] : m->named_modules())
    if (auto* bn = dynamic_cast<BatchNormNd*>(mod)) bn->set_layer_id(id++);
  m->init(seed);
  if (entry.dense)
    // The head starts near zero (N(0, 0.001)-sized, bias 0), as heatmap
    // networks initialize their last layer: outputs begin at the empty map
    // instead of noise that SGD first spends its steps removing.
    for (auto& [pname, p] : m->named_parameters())
      if (pname.rfind("head.", 0) == 0)
        for (int64_t i = 0; i < p->value.numel(); ++i)
          p->value.f32()[i] = pname == "head.bias" ? 0.0f : p->value.f32()[i] * 0.003f;
  return m;
}

}  // namespace fanout::models
