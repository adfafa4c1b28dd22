// config.json → ModelSpec in both spellings: transformers 5 (rope_parameters,
// layer_types) and the older one real checkpoints mostly use.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "model/config.h"
#include "util/error.h"

namespace kettle {
namespace {

using nlohmann::json;

json golden_config(const std::string& name) {
  std::ifstream in(std::string(KETTLE_TEST_DATA) + "/goldens/" + name + "/model/config.json");
  return json::parse(in);
}

std::vector<int> windows(const ModelSpec& s) {
  std::vector<int> w;
  for (auto& l : s.layers) w.push_back(l.sliding_window);
  return w;
}

double theta_of_layer(const ModelSpec& s, size_t layer) { return s.ropes[static_cast<size_t>(s.layers[layer].rope)].theta; }

TEST(Config, LlamaDefaults) {
  ModelSpec s = parse_model_config(golden_config("llama"), "llama");
  EXPECT_EQ(s.hidden_size, 64);
  EXPECT_EQ(s.n_heads, 4);
  EXPECT_EQ(s.n_kv_heads, 2);
  EXPECT_EQ(s.head_dim, 16);
  EXPECT_EQ(s.act, Activation::kSilu);
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_FLOAT_EQ(s.attn_scale, 0.25f);
  EXPECT_EQ(windows(s), std::vector<int>({0, 0}));
  EXPECT_EQ(s.ropes.size(), 1u);
  EXPECT_DOUBLE_EQ(s.ropes[0].theta, 10000.0);
}

TEST(Config, Llama3RopeInBothSpellings) {
  json v5 = golden_config("llama3_rope");
  json old = v5;
  old.erase("rope_parameters");
  old["rope_theta"] = 500000.0;
  old["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  for (const json& c : {v5, old}) {
    ModelSpec s = parse_model_config(c, "llama3");
    ASSERT_EQ(s.ropes.size(), 1u);
    EXPECT_EQ(s.ropes[0].type, RopeType::kLlama3);
    EXPECT_DOUBLE_EQ(s.ropes[0].theta, 500000.0);
    EXPECT_DOUBLE_EQ(s.ropes[0].factor, 8.0);
    EXPECT_EQ(s.ropes[0].original_max_position, 64);
    EXPECT_TRUE(s.tie_word_embeddings);
  }
}

TEST(Config, Gemma3LocalAndGlobalRopeInBothSpellings) {
  json v5 = golden_config("gemma3");
  json old = v5;
  old.erase("rope_parameters");
  old.erase("layer_types");
  old["rope_theta"] = 1000000.0;
  old["rope_local_base_freq"] = 10000.0;
  old["sliding_window_pattern"] = 2;
  for (const json& c : {v5, old}) {
    ModelSpec s = parse_model_config(c, "gemma3");
    EXPECT_EQ(windows(s), std::vector<int>({16, 0}));
    EXPECT_DOUBLE_EQ(theta_of_layer(s, 0), 10000.0);
    EXPECT_DOUBLE_EQ(theta_of_layer(s, 1), 1000000.0);
    EXPECT_TRUE(s.norm_add_one);
    EXPECT_TRUE(s.sandwich_norms);
    EXPECT_EQ(s.act, Activation::kGeluTanh);
    EXPECT_FLOAT_EQ(s.embed_scale, 8.0f);
    EXPECT_FLOAT_EQ(s.attn_scale, 0.25f);  // query_pre_attn_scalar 16
  }
}

TEST(Config, Gemma3DefaultPatternIsFiveSlidingThenOneGlobal) {
  json c = golden_config("gemma3");
  c.erase("layer_types");
  c.erase("sliding_window_pattern");
  c.erase("_sliding_window_pattern");
  c["num_hidden_layers"] = 12;
  c.erase("rope_parameters");
  ModelSpec s = parse_model_config(c, "gemma3");
  EXPECT_EQ(windows(s), std::vector<int>({16, 16, 16, 16, 16, 0, 16, 16, 16, 16, 16, 0}));
}

TEST(Config, Gemma2AlternatesWithoutLayerTypes) {
  json c = golden_config("gemma2");
  c.erase("layer_types");
  c["num_hidden_layers"] = 4;
  ModelSpec s = parse_model_config(c, "gemma2");
  EXPECT_EQ(windows(s), std::vector<int>({16, 0, 16, 0}));
  EXPECT_FLOAT_EQ(s.attn_softcap, 0.0f);  // transformers' default SDPA path does not cap scores
  EXPECT_FLOAT_EQ(s.final_softcap, 30.0f);
  c["attn_implementation"] = "eager";
  EXPECT_FLOAT_EQ(parse_model_config(c, "gemma2").attn_softcap, 50.0f);
}

TEST(Config, MistralSlidingWindowOnEveryLayer) {
  json c = golden_config("mistral");
  EXPECT_EQ(windows(parse_model_config(c, "mistral")), std::vector<int>({16, 16}));
  c["sliding_window"] = nullptr;
  EXPECT_EQ(windows(parse_model_config(c, "mistral")), std::vector<int>({0, 0}));
}

TEST(Config, Qwen2OldSlidingSpelling) {
  json c = golden_config("qwen2");
  c.erase("layer_types");
  c["num_hidden_layers"] = 4;
  c["sliding_window"] = 32;
  c["max_window_layers"] = 2;
  c["use_sliding_window"] = false;
  EXPECT_EQ(windows(parse_model_config(c, "qwen2")), std::vector<int>({0, 0, 0, 0}));
  c["use_sliding_window"] = true;
  EXPECT_EQ(windows(parse_model_config(c, "qwen2")), std::vector<int>({0, 0, 32, 32}));
}

TEST(Config, HeadDimExplicitOrDerived) {
  EXPECT_EQ(parse_model_config(golden_config("qwen3"), "qwen3").head_dim, 32);
  json c = golden_config("mixtral");  // "head_dim": null
  EXPECT_EQ(parse_model_config(c, "mixtral").head_dim, 16);
}

TEST(Config, MoeKeysInBothSpellings) {
  json c = golden_config("qwen3_moe");
  ModelSpec s = parse_model_config(c, "qwen3_moe");
  EXPECT_EQ(s.n_experts, 8);
  EXPECT_EQ(s.experts_per_token, 2);
  EXPECT_EQ(s.expert_intermediate_size, 48);
  EXPECT_TRUE(s.norm_topk_prob);
  c.erase("num_local_experts");
  c["num_experts"] = 8;
  c["mlp_only_layers"] = {0};
  s = parse_model_config(c, "qwen3_moe");
  EXPECT_EQ(s.n_experts, 8);
  EXPECT_FALSE(s.layers[0].moe);
  EXPECT_TRUE(s.layers[1].moe);
  c["mlp_only_layers"] = json::array();
  c["decoder_sparse_step"] = 2;
  s = parse_model_config(c, "qwen3_moe");
  EXPECT_FALSE(s.layers[0].moe);
  EXPECT_TRUE(s.layers[1].moe);
}

TEST(Config, Phi3PartialRotaryAndLongRope) {
  json c = golden_config("phi3");
  c.erase("rope_parameters");
  c["partial_rotary_factor"] = 0.5;
  c["rope_theta"] = 10000.0;
  c["original_max_position_embeddings"] = 4096;
  c["max_position_embeddings"] = 131072;
  c["rope_scaling"] = {{"type", "longrope"}, {"short_factor", json::array()}, {"long_factor", json::array()}};
  for (int i = 0; i < 4; ++i) {
    c["rope_scaling"]["short_factor"].push_back(1.0 + i);
    c["rope_scaling"]["long_factor"].push_back(2.0 + i);
  }
  ModelSpec s = parse_model_config(c, "phi3");
  EXPECT_EQ(s.ropes[0].type, RopeType::kLongRope);
  EXPECT_DOUBLE_EQ(s.ropes[0].partial_rotary_factor, 0.5);
  EXPECT_EQ(s.ropes[0].short_factor.size(), 4u);
}

void expect_config_error(const json& c, ErrorCategory category, const std::string& needle) {
  try {
    parse_model_config(c, "cfg.json");
    FAIL() << "expected an error naming " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), category);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
  }
}

TEST(Config, ErrorsNameTheKey) {
  json c = golden_config("llama");
  c.erase("hidden_size");
  expect_config_error(c, ErrorCategory::kInvalidData, "hidden_size");
  c = golden_config("llama");
  c["num_key_value_heads"] = 3;
  expect_config_error(c, ErrorCategory::kInvalidData, "num_key_value_heads");
  c = golden_config("llama");
  c["model_type"] = "gpt_bigcode";
  expect_config_error(c, ErrorCategory::kUnsupported, "gpt_bigcode");
  c = golden_config("llama");
  c["rope_parameters"]["rope_type"] = "warp";
  expect_config_error(c, ErrorCategory::kUnsupported, "warp");
  c = golden_config("llama");
  c["hidden_act"] = "relu6";
  expect_config_error(c, ErrorCategory::kUnsupported, "relu6");
}

}  // namespace
}  // namespace kettle
