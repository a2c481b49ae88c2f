// Embedding, torch.nn.Embedding(num_embeddings, embedding_dim): int32 ids
// (N...) select rows of weight (num_embeddings, embedding_dim), giving
// (N..., embedding_dim); weight N(0, 1) initially, as torch's. Backward adds
// the rows' gradients into weight's (kernels/embedding.h: deterministic on
// every backend); ids take no gradient.
#pragma once
#include "runtime/nn/module.h"

namespace fanout::models {

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& ids, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override { return std::make_unique<Embedding>(num_, dim_); }
  std::string type_name() const override { return "Embedding"; }
  void reset_parameters(std::mt19937_64& rng) override;
  Parameter& weight() { return *w_; }
  int64_t num_embeddings() const { return num_; }
  int64_t embedding_dim() const { return dim_; }

 private:
  int64_t num_, dim_;
  Parameter* w_;
  Tensor ids_, y_;
};

}  // namespace fanout::models
