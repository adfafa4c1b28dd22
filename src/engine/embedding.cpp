#include "engine/embedding.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "util/error.h"

namespace kettle {

EmbeddingModel embedding_model(const Model& model) {
  if (!model.embedding)
    fail(ErrorCategory::kInvalidArgument, "{} is not an embedding model (its folder has no sentence-transformers "
         "Pooling module in modules.json)", model.source);
  EmbeddingModel out{*model.embedding, model.spec.hidden_size, model.spec.max_position_embeddings};
  if (out.spec.max_tokens > 0) out.context = out.context > 0 ? std::min(out.context, out.spec.max_tokens) : out.spec.max_tokens;
  return out;
}

std::string embedding_prompt(const EmbeddingModel& model, const std::string& prompt_name) {
  const std::string& name = prompt_name.empty() ? model.spec.default_prompt_name : prompt_name;
  if (name.empty()) return {};
  const auto it = model.spec.prompts.find(name);
  if (it != model.spec.prompts.end()) return it->second;
  std::string known;
  for (const auto& [n, text] : model.spec.prompts) known += (known.empty() ? "'" : ", '") + n + "'";
  fail(ErrorCategory::kInvalidArgument, "prompt_name '{}' is not one of this model's prompts ({})", name,
       known.empty() ? "it has none" : known);
}

GenerationRequest embedding_request(const EmbeddingModel& model, std::vector<int32_t> ids, size_t index) {
  if (ids.empty()) fail(ErrorCategory::kInvalidArgument, "input {} is empty: give some text", index);
  if (model.context > 0 && static_cast<int64_t>(ids.size()) > model.context)
    fail(ErrorCategory::kInvalidArgument, "input {} has {} tokens; this model embeds at most {}", index, ids.size(),
         model.context);
  GenerationRequest request;
  request.prompt = std::move(ids);
  request.max_tokens = 0;
  request.pooling = model.spec.pooling;
  request.normalize = model.spec.normalize;
  return request;
}

void check_dimensions(const EmbeddingModel& model, int64_t dimensions) {
  if (dimensions == 0 || dimensions == model.hidden_size) return;
  if (dimensions < 0 || dimensions > model.hidden_size)
    fail(ErrorCategory::kInvalidArgument, "dimensions is {}: give 1 to {} (this model's width)", dimensions,
         model.hidden_size);
  if (!model.spec.matryoshka)
    fail(ErrorCategory::kInvalidArgument, "dimensions {}: this model is not Matryoshka-trained (its config.json sets "
         "neither is_matryoshka nor matryoshka_dimensions), so only its full width {} is meaningful", dimensions,
         model.hidden_size);
  const auto& allowed = model.spec.matryoshka_dimensions;
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), dimensions) == allowed.end())
    fail(ErrorCategory::kInvalidArgument, "dimensions {} is not one this model was trained for ({})", dimensions,
         fmt::join(allowed, ", "));
}

std::vector<float> truncate_embedding(std::vector<float> embedding, int64_t dimensions) {
  if (dimensions <= 0 || dimensions >= static_cast<int64_t>(embedding.size())) return embedding;
  embedding.resize(static_cast<size_t>(dimensions));
  double norm = 0.0;
  for (float v : embedding) norm += static_cast<double>(v) * v;
  if (norm > 0.0)
    for (float& v : embedding) v = static_cast<float>(v / std::sqrt(norm));
  return embedding;
}

}  // namespace kettle
