// Image sets in WebDataset's tar shards: "wds:DIR" with DIR/train-*.tar and
// DIR/val-*.tar (sorted by name), each sample a KEY.jpg, KEY.jpeg or KEY.png
// beside KEY.cls (its class index as text) in the same shard; the key is the
// member's path up to the first dot of its file name, as WebDataset's. At
// open, each shard's headers are read once (and the small .cls members);
// samples are then read from their offsets. Training reads the shards in a
// permuted order split over the ranks, through a bounded shuffle buffer
// (ShardBufferSampler), so reads stay near-sequential; evaluation reads in
// order. The transforms are image folders' (image_folder.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/image_folder.h"

namespace fanout::data {

// Samples the training shuffle buffer holds.
constexpr int64_t kWdsShuffleBuffer = 1000;

struct TarMember {
  std::string name;
  int64_t offset = 0, size = 0;  // the data's bytes in the file
};
// The regular files of a tar archive (ustar, GNU long names, pax paths), in
// order; a bad header or a member past the end is a one-line error naming the file.
std::vector<TarMember> list_tar(const std::string& path);

// One-line errors: no shards, a sample without its image or its .cls, a
// .cls that is not a class index, validation classes beyond training's.
ImageFolderSplits open_wds(const std::string& dir, const Augment& augment, const std::string& normalize,
                           bool skip_bad = false);

}  // namespace fanout::data
