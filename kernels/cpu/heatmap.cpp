// CPU heatmaps: the separable renderer of runtime/data/heatmap.h, which also
// checks the coordinates (finite) and the channel indices.
#include "kernels/heatmap.h"

#include "runtime/data/heatmap.h"

namespace fanout::kernels::cpu {

static_assert(kMaxHeatmapRadius == data::kMaxHeatmapRadius, "one radius limit for both APIs");

void render_heatmaps(Context&, const Tensor& landmarks, const HeatmapParams& p, Tensor& out,
                     const Tensor* channels) {
  data::render_heatmaps_batch(landmarks, data::HeatmapSpec{p.radius, p.sigma}, out,
                              channels ? *channels : Tensor());
}

}  // namespace fanout::kernels::cpu
