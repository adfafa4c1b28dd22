// load_embedding_spec on the files sentence-transformers writes: the spelling before
// version 6 (a flag per pooling mode, "sentence_transformers.models.*" module types,
// max_seq_length in sentence_bert_config.json; what Qwen3-Embedding and most Hub
// checkpoints ship) and version 6's (one pooling_mode string, model_max_length in
// tokenizer_config.json: the committed embedding goldens); refusals name file and key.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "model/embedding_spec.h"
#include "util/error.h"

namespace kettle {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class EmbeddingSpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kettle-embedding-spec-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "1_Pooling");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const json& value) { std::ofstream(dir_ / name) << value.dump(2); }
  void modules(const std::vector<std::string>& types) {
    json list = json::array();
    for (size_t i = 0; i < types.size(); ++i)
      list.push_back({{"idx", i}, {"name", std::to_string(i)}, {"path", types[i].ends_with("Pooling") ? "1_Pooling" : ""},
                      {"type", types[i]}});
    write("modules.json", list);
  }
  std::string folder() const { return dir_.string(); }
  fs::path dir_;
};

TEST_F(EmbeddingSpecTest, Qwen3EmbeddingAsPublished) {
  modules({"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
           "sentence_transformers.models.Normalize"});
  write("1_Pooling/config.json", {{"word_embedding_dimension", 1024}, {"pooling_mode_cls_token", false},
                                  {"pooling_mode_mean_tokens", false}, {"pooling_mode_max_tokens", false},
                                  {"pooling_mode_lasttoken", true}, {"include_prompt", true}});
  write("sentence_bert_config.json", {{"max_seq_length", 8192}, {"do_lower_case", false}});
  write("config_sentence_transformers.json",
        {{"prompts", {{"query", "Instruct: Given a web search query\nQuery:"}, {"document", ""}}},
         {"default_prompt_name", nullptr}});
  write("tokenizer_config.json", {{"model_max_length", 131072}});
  write("config.json", {{"model_type", "qwen3"}, {"matryoshka_dimensions", {32, 64, 128}}});
  const std::optional<EmbeddingSpec> spec = load_embedding_spec(folder());
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->pooling, Pooling::kLastToken);
  EXPECT_TRUE(spec->normalize);
  EXPECT_EQ(spec->max_tokens, 8192);  // sentence_bert_config.json wins over the tokenizer's
  EXPECT_EQ(spec->prompts.at("query"), "Instruct: Given a web search query\nQuery:");
  EXPECT_EQ(spec->default_prompt_name, "");
  EXPECT_TRUE(spec->matryoshka);
  EXPECT_EQ(spec->matryoshka_dimensions, (std::vector<int64_t>{32, 64, 128}));
}

TEST_F(EmbeddingSpecTest, SentenceTransformers6Spelling) {
  modules({"sentence_transformers.base.modules.transformer.Transformer",
           "sentence_transformers.sentence_transformer.modules.pooling.Pooling"});
  write("1_Pooling/config.json", {{"embedding_dimension", 64}, {"pooling_mode", "mean"}, {"include_prompt", true}});
  write("sentence_bert_config.json", {{"transformer_task", "feature-extraction"}});
  write("tokenizer_config.json", {{"model_max_length", 512}});
  write("config_sentence_transformers.json", {{"prompts", {{"q", "Q: "}}}, {"default_prompt_name", "q"}});
  const std::optional<EmbeddingSpec> spec = load_embedding_spec(folder());
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->pooling, Pooling::kMean);
  EXPECT_FALSE(spec->normalize);
  EXPECT_EQ(spec->max_tokens, 512);
  EXPECT_EQ(spec->default_prompt_name, "q");
  EXPECT_FALSE(spec->matryoshka);
}

TEST_F(EmbeddingSpecTest, NoModulesOrNoPoolingIsALanguageModel) {
  EXPECT_FALSE(load_embedding_spec(folder()));
  modules({"sentence_transformers.models.Transformer"});
  EXPECT_FALSE(load_embedding_spec(folder()));
}

TEST_F(EmbeddingSpecTest, RefusesWhatItDoesNotCompute) {
  auto refused = [&](const json& pooling, const std::string& needle) {
    modules({"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling"});
    write("1_Pooling/config.json", pooling);
    try {
      load_embedding_spec(folder());
      ADD_FAILURE() << "accepted " << pooling.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("1_Pooling"), std::string::npos) << e.what();
    }
  };
  refused({{"pooling_mode_max_tokens", true}}, "pooling_mode_max_tokens");
  refused({{"pooling_mode", "weightedmean"}}, "weightedmean");
  refused({{"pooling_mode_lasttoken", true}, {"pooling_mode_mean_tokens", true}}, "more than one");
  refused({{"pooling_mode_lasttoken", true}, {"include_prompt", false}}, "include_prompt");
  refused(json::object(), "no pooling mode");
  modules({"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
           "sentence_transformers.models.Dense"});
  write("1_Pooling/config.json", {{"pooling_mode_mean_tokens", true}});
  EXPECT_THROW(load_embedding_spec(folder()), Error);
  write("modules.json", {{"not", "a list"}});
  EXPECT_THROW(load_embedding_spec(folder()), Error);
}

}  // namespace
}  // namespace kettle
