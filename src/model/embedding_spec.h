// EmbeddingSpec: how an embedding model turns its hidden states into one vector
// per text, as its sentence-transformers files say (modules.json, the Pooling
// module's config.json, a Normalize module, config_sentence_transformers.json's
// prompts, sentence_bert_config.json's max_seq_length) and config.json's
// Matryoshka keys. A folder without a Pooling module is a language model.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kettle {

enum class Pooling { kNone, kLastToken, kMean, kCls };

const char* pooling_name(Pooling pooling);

struct EmbeddingSpec {
  Pooling pooling = Pooling::kLastToken;
  bool normalize = false;                     // a Normalize module: unit length
  std::map<std::string, std::string> prompts;  // name -> text put before the input
  std::string default_prompt_name;            // applied when a request names none ("" : none)
  int64_t max_tokens = 0;                      // max_seq_length (0: the model's context)
  // `dimensions` (truncate, then renormalize): any size up to hidden when the model is
  // Matryoshka-trained (is_matryoshka), or one of matryoshka_dimensions when it lists them.
  bool matryoshka = false;
  std::vector<int64_t> matryoshka_dimensions;
};

// The folder's embedding spec, or nullopt for a language model; an error names the file
// and key it cannot use (a Dense module, a pooling mode kettle does not compute).
std::optional<EmbeddingSpec> load_embedding_spec(const std::string& folder);

}  // namespace kettle
