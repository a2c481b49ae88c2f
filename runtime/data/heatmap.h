// Landmark heatmaps for the data pipeline: the kernels' CPU renderer
// (kernels/heatmap.h defines the values) under the pipeline's names.
#pragma once
#include "kernels/heatmap.h"

namespace fanout::data {

using HeatmapSpec = kernels::HeatmapParams;
using kernels::kMaxHeatmapRadius;
using kernels::render_heatmap_merged;
using kernels::render_heatmaps;
using kernels::render_heatmaps_batch;
using kernels::render_heatmaps_naive;

}  // namespace fanout::data
