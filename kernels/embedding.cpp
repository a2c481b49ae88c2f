// Embedding entry points: checks, then dispatch; the bad-id message both
// backends throw.
#include "kernels/embedding.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

namespace {
// ids (N...) int32 of 1 to 4 dims, a table (V, E) float32 or a float32 /
// float64 gradient table, rows (N..., E) float32 beside ids.
void check_shapes(const Context& ctx, const char* op, const Tensor& ids, const char* rows_name, const Tensor& rows,
                  const Tensor& table) {
  detail::check_tensor(ctx, op, "ids", ids, DType::I32);
  detail::check_tensor(ctx, op, rows_name, rows);
  FANOUT_CHECK(ids.dim() >= 1 && ids.dim() < Shape::kMaxDims)
      << op << ": ids " << ids.shape().str() << " must have 1 to " << Shape::kMaxDims - 1 << " dims";
  FANOUT_CHECK(table.dim() == 2 && table.size(0) >= 1 && table.size(0) <= INT32_MAX && table.size(1) >= 1)
      << op << ": the table " << table.shape().str() << " must be (V, E) with V, E >= 1";
  FANOUT_CHECK(ids.numel() <= INT32_MAX) << op << ": " << ids.numel() << " ids";
  Shape want = ids.shape();
  want.d[static_cast<size_t>(want.ndim++)] = table.size(1);
  FANOUT_CHECK(rows.shape() == want) << op << ": " << rows_name << " " << rows.shape().str() << " for ids "
                                     << ids.shape().str() << " and table " << table.shape().str() << " must be "
                                     << want.str();
}
}  // namespace

void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& weight, Tensor& y) {
  detail::check_tensor(ctx, "embedding_forward", "weight", weight);
  check_shapes(ctx, "embedding_forward", ids, "y", y, weight);
  if (ids.numel() > 0) FANOUT_DISPATCH(ctx, embedding_forward, ctx, ids, weight, y);
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dy, Tensor& dweight) {
  detail::check_grad(ctx, "embedding_backward", "dweight", dweight);
  check_shapes(ctx, "embedding_backward", ids, "dy", dy, dweight);
  if (ids.numel() > 0) FANOUT_DISPATCH(ctx, embedding_backward, ctx, ids, dy, dweight);
}

namespace detail {

void embedding_bad_id(const Context& ctx, const char* op, const Tensor& ids, int64_t pos, int64_t id,
                      int64_t vocab) {
  // pos is the element's offset in this replica's ids: name the user's batch row and the position in it.
  const int64_t row_size = ids.numel() / ids.size(0);
  FANOUT_FAIL() << op << ": id " << id << " at batch row " << ctx.first_row + pos / row_size
                << (ids.shape().ndim > 1 ? ", position " + std::to_string(pos % row_size) : std::string())
                << " is outside the vocabulary [0, " << vocab << ")";
}

}  // namespace detail
}  // namespace fanout::kernels
