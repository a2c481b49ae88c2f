// Embedding layer.
#include "models/layers/embedding.h"

#include "kernels/embedding.h"
#include "models/layers/init.h"
#include "runtime/core/error.h"

namespace fanout::models {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim) : num_(num_embeddings), dim_(embedding_dim) {
  FANOUT_USER_CHECK(num_embeddings >= 1 && num_embeddings <= INT32_MAX && embedding_dim >= 1)
      << "Embedding(" << num_embeddings << ", " << embedding_dim << "): sizes must be positive (and rows < 2^31)";
  w_ = &register_parameter("weight", Shape{num_embeddings, embedding_dim});
}

void Embedding::reset_parameters(std::mt19937_64& rng) { normal_fill(w_->value, 1.0f, rng); }

Tensor Embedding::forward(const Tensor& ids, Context& ctx) {
  FANOUT_USER_CHECK(ids.dtype() == DType::I32 && ids.dim() >= 1 && ids.dim() < Shape::kMaxDims)
      << "Embedding(" << num_ << ", " << dim_ << ") takes int32 ids of 1 to " << Shape::kMaxDims - 1
      << " dims, got " << dtype_name(ids.dtype()) << " " << ids.shape().str();
  ids_ = ids;
  Shape ys = ids.shape();
  ys.d[static_cast<size_t>(ys.ndim++)] = dim_;
  ensure(y_, ys, ctx);
  kernels::embedding_forward(ctx, ids, w_->value, y_);
  return y_;
}

Tensor Embedding::backward(const Tensor& dy, Context& ctx) {
  kernels::embedding_backward(ctx, ids_, dy, w_->grad);
  notify_grads_ready(ctx);
  return Tensor();  // ids are not differentiable
}

}  // namespace fanout::models
