// Keypoint (landmark) datasets: volumes whose targets are the heatmaps of K
// landmarks (ImageDataset::landmarks; the loader renders them).
//
// keypoints3d:DIR reads DIR/train and DIR/test, each holding one .npy file
// per volume, (D, H, W) or (C, D, H, W) of any dtype load_npy reads
// (converted to float32), and the landmarks of every volume in either
//   landmarks.json  {"NAME": [[z, y, x], ...], ...}  (NAME: the file's stem)
//   landmarks.csv   header "name,landmark,z,y,x", then one row per landmark
//                   (landmark indices 0..K-1, each once per volume)
// in voxel coordinates. Every volume has the same shape and K landmarks;
// samples are in the order of their sorted names. The channels are
// normalized with the training split's mean and std.
//
// synthetic3d[:N] is seeded: N training volumes (1, 32, 32, 32) (and N / 5,
// at least 10, for testing), each with K = 4 blobs at random positions that
// differ in shape and brightness, so that each landmark is distinguishable.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/data/dataset.h"

namespace fanout::data {

TrainTest load_keypoints3d(const std::string& dir, const HeatmapSpec& heatmap);

inline constexpr int64_t kSynthetic3dSide = 32;
inline constexpr int64_t kSynthetic3dLandmarks = 4;
TrainTest make_synthetic3d(int64_t n_train, uint64_t seed, const HeatmapSpec& heatmap);

}  // namespace fanout::data
