// Model zoo: mlp, lenet, cnn, resnet18 (classifiers of (C, H, W) images) and
// heatmap3d (landmark heatmaps of (C, D, H, W) volumes). Every builder takes
// the sample shape and the class (or landmark) count, and refuses shapes the
// model cannot take with a one-line error. Models come back materialized on the CPU and initialized
// from `seed` as PyTorch initializes the same architecture.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/module.h"

namespace fanout::models {

// Flatten, fc1 (in -> 512), relu, fc2 (512 -> 256), relu, fc3 (256 -> classes).
std::unique_ptr<Module> mlp(const Shape& input, int classes);
// LeNet-5: conv1 5x5 -> 6, relu, maxpool 2, conv2 5x5 -> 16, relu, maxpool 2,
// fc1 -> 120, relu, fc2 -> 84, relu, fc3 -> classes. Inputs smaller than
// 32x32 get conv1 padding so that 28x28 sees the classic 32x32 geometry.
std::unique_ptr<Module> lenet(const Shape& input, int classes);
// Three conv(3x3)-BatchNorm-ReLU-maxpool blocks (32, 64, 128 channels),
// fc1 -> 256, relu, fc2 -> classes.
std::unique_ptr<Module> cnn(const Shape& input, int classes);
// torchvision resnet18 names and shapes. CIFAR stem: conv1 3x3 stride 1, no
// max pool; ImageNet stem: conv1 7x7 stride 2 pad 3, maxpool 3/2/1.
// With checkpoint: each BasicBlock is Checkpointed (same names).
std::unique_ptr<Module> resnet18(const Shape& input, int classes, bool imagenet_stem = false,
                                 bool checkpoint = false);

// A small 3-D encoder-decoder: (C, D, H, W) -> (landmarks, D, H, W), one
// heatmap per landmark. Two levels of conv(3^3)-BatchNorm3d-ReLU and max
// pool (width, 2 width channels), a middle block (4 width), then two levels of
// nearest upsampling and conv-BN-ReLU (2 width, width) and a 1^3 conv head.
// D, H and W must be multiples of 4, at least 8. With group_norm
// ("heatmap3d:group") GroupNorm(4, channels) in place of each BatchNorm3d:
// statistics per sample, for small per-device batches of volumes.
// With checkpoint: each stage (conv, norm, ReLU and its pooling or
// upsampling) is Checkpointed (same names).
std::unique_ptr<Module> heatmap3d(const Shape& input, int landmarks, int64_t width = 8, bool group_norm = false,
                                  bool checkpoint = false);

// "mlp", "lenet", "cnn", "resnet18", "resnet18:imagenet", "heatmap3d", "heatmap3d:group", and
// "gpt:PRESET,KEY=VALUE,..." (models/zoo/gpt.h: samples are (T) token ids,
// `classes` the data's vocabulary). Unknown names throw
// a one-line error listing the known ones. The model is initialized from seed.
// checkpoint_activations: the model's blocks are Checkpointed
// (models/layers/checkpointed.h); a one-line error for a model without blocks.
std::unique_ptr<Module> make_model(const std::string& name, const Shape& input, int classes, uint64_t seed,
                                   bool checkpoint_activations = false);
std::vector<std::string> model_names();
// make_model's one-line error for a name it does not know (a GPT's settings are checked when it is made).
void check_model_name(const std::string& name);
// Whether the model's output is dense (heatmaps) rather than class scores
// (false for a name the zoo does not know: make_model says so).
bool dense_output(const std::string& name);
// Whether `name` is a GPT ("gpt" or "gpt:..."), whose loss is token_cross_entropy.
bool is_gpt(const std::string& name);

}  // namespace fanout::models
