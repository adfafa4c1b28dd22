// The engine core on a tiny real checkpoint (CPU): verify entries give exactly
// the tokens of decoding one at a time, whether the drafts are right or wrong;
// a sequence saved mid-generation and resumed in another engine draws what it
// would have drawn (sampled, seeded); a request that can never run ends at once
// with the error's kind; a cancelled one ends within a step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "model/model.h"
#include "model/model_runner.h"
#include "support/token_sink.h"

namespace kettle {
namespace {

namespace fs = std::filesystem;

using test_support::TokenSink;

class EngineCoreTest : public ::testing::Test {
 protected:
  GenerationRequest request(int64_t max_tokens, float temperature = 0.0f) const {
    GenerationRequest r;
    r.prompt = {1, 17, 42, 99, 5, 23};
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = temperature;
    r.sampling.seed = 1234;
    return r;
  }
  std::vector<int32_t> plain(const GenerationRequest& r) {
    EngineCore core(model_, nullptr, {backend_.get()}, EngineOptions{});
    return generate(core, r).tokens;
  }

  Model model_ = load_model((fs::path(KETTLE_TEST_DATA) / "goldens" / "llama" / "model").string());
  std::unique_ptr<Backend> backend_ = make_cpu_backend(1);
};

// Before each step, the running sequence gets `k` drafts: the true continuation (right)
// or shifted ids (wrong); either way the output is the plain run's.
TEST_F(EngineCoreTest, VerifiedDraftsGiveTheTokensOfDecodingOneAtATime) {
  for (const float temperature : {0.0f, 0.9f}) {
    const GenerationRequest r = request(16, temperature);
    const std::vector<int32_t> expected = plain(r);
    for (const bool right : {true, false}) {
      EngineCore core(model_, nullptr, {backend_.get()}, EngineOptions{});
      auto sink = std::make_shared<TokenSink>();
      core.submit(r, sink);
      int verified = 0;
      while (!core.idle()) {
        for (const auto& seq : core.scheduler().running_sequences()) {
          if (!seq->decoding() || seq->finished()) continue;
          const auto done = static_cast<size_t>(seq->produced());
          for (size_t i = done; i < std::min(done + 3, expected.size()); ++i)
            seq->draft().push_back(right ? expected[i] : (expected[i] + 1) % 64);
          verified += !seq->draft().empty();
        }
        core.step();
      }
      ASSERT_TRUE(sink->end.ok()) << sink->end.error;
      EXPECT_EQ(sink->tokens, expected) << (right ? "right" : "wrong") << " drafts, temperature " << temperature;
      EXPECT_GT(verified, 0);
      if (right && temperature == 0.0f) {
        EXPECT_LE(verified, 6) << "right drafts advance several tokens a step";
      }
    }
  }
}

TEST_F(EngineCoreTest, ASavedSequenceResumesWhereItStopped) {
  const GenerationRequest r = request(20, 0.8f);
  const std::vector<int32_t> expected = plain(r);
  nlohmann::json saved;
  std::vector<int32_t> before;
  {
    EngineCore core(model_, nullptr, {backend_.get()}, EngineOptions{});
    auto sink = std::make_shared<TokenSink>();
    core.submit(r, sink);
    while (sink->tokens.size() < 7) core.step();
    saved = core.scheduler().running_sequences().at(0)->save();
    before = sink->tokens;
  }
  EngineCore other(model_, nullptr, {backend_.get()}, EngineOptions{});
  auto sink = std::make_shared<TokenSink>();
  other.resume(nlohmann::json::parse(saved.dump()), sink);
  other.run_until_idle();
  ASSERT_TRUE(sink->end.ok()) << sink->end.error;
  before.insert(before.end(), sink->tokens.begin(), sink->tokens.end());
  EXPECT_EQ(before, expected);
  EXPECT_EQ(sink->end.completion_tokens, 20);

  auto broken = std::make_shared<TokenSink>();
  saved["version"] = 99;
  other.resume(saved, broken);
  EXPECT_EQ(broken->end.finish_reason, "error");
  EXPECT_NE(broken->end.error.find("version 99"), std::string::npos) << broken->end.error;
}

TEST_F(EngineCoreTest, ARequestThatCanNeverRunEndsAtOnceWithItsKind) {
  EngineOptions options;
  options.kv_budget_bytes = 64 * 1024;
  EngineCore core(model_, nullptr, {backend_.get()}, options);
  auto sink = std::make_shared<TokenSink>();
  core.submit(request(100000), sink);
  EXPECT_EQ(sink->end.finish_reason, "error");
  EXPECT_EQ(sink->end.error_category, ErrorCategory::kResourceExhausted);
  EXPECT_TRUE(core.idle());
  GenerationRequest bad = request(4);
  bad.prompt.push_back(static_cast<int32_t>(model_.spec.vocab_size));
  core.submit(bad, sink);
  EXPECT_EQ(sink->end.error_category, ErrorCategory::kInvalidArgument);
  EXPECT_NE(sink->end.error.find("position 6"), std::string::npos) << sink->end.error;
}

// A prompt that is only scored (max_tokens 0, prompt_logprobs): every position's
// log-probability of the next prompt token, across prefill chunks and although an
// earlier request left the same prefix in the cache, equals a double log-softmax of the
// logits of one whole-prompt forward; nothing is drawn.
TEST_F(EngineCoreTest, AScoredPromptGivesEveryPositionsLogprobAndDrawsNothing) {
  EngineOptions options;
  options.prefill_chunk = 5;
  options.prompt_cache_bytes = 1 << 20;
  options.kv_block_size = 4;
  EngineCore core(model_, nullptr, {backend_.get()}, options);
  const std::vector<int32_t> prompt = {1, 17, 42, 99, 5, 23, 8, 64, 3, 11, 7, 50, 2};
  GenerationRequest warm = request(2);
  warm.prompt = prompt;
  generate(core, warm);  // its blocks are cached now
  GenerationRequest scored;
  scored.prompt = prompt;
  scored.max_tokens = 0;
  scored.prompt_logprobs = true;
  std::vector<double> got(prompt.size() - 1, NAN);
  const GenerationResult result = generate(core, scored, [&](const GenerationOutput& out) {
    for (size_t i = 0; i < out.prompt_logprobs.size(); ++i) got.at(static_cast<size_t>(out.first_position) + i) = out.prompt_logprobs[i];
  });
  ASSERT_TRUE(result.end.ok()) << result.end.error;
  EXPECT_TRUE(result.tokens.empty());
  EXPECT_EQ(result.end.completion_tokens, 0);
  EXPECT_EQ(result.end.cached_tokens, 0) << "a scored prompt runs every position";

  const int64_t vocab = model_.spec.vocab_size, n = static_cast<int64_t>(prompt.size());
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  StandaloneRunner reference = make_standalone_runner(model_, {backend_.get()});
  KvCache kv = reference->new_cache();
  reference->forward(prompt.data(), n, kv, LogitsFor::kAllTokens, logits.data());
  for (int64_t p = 0; p + 1 < n; ++p) {
    const float* row = logits.data() + p * vocab;
    double m = *std::max_element(row, row + vocab), z = 0;
    for (int64_t v = 0; v < vocab; ++v) z += std::exp(row[v] - m);
    EXPECT_NEAR(got[static_cast<size_t>(p)], row[prompt[static_cast<size_t>(p + 1)]] - m - std::log(z), 1e-9)
        << "position " << p;
  }
}

TEST_F(EngineCoreTest, ACancelledGenerationEndsWithinAStep) {
  EngineCore core(model_, nullptr, {backend_.get()}, EngineOptions{});
  auto sink = std::make_shared<TokenSink>();
  core.submit(request(50), sink);
  while (sink->tokens.size() < 3) core.step();
  sink->cancel = true;
  core.step();
  EXPECT_TRUE(core.idle());
  EXPECT_EQ(sink->end.finish_reason, "cancelled");
  EXPECT_EQ(sink->tokens.size(), 3u);
  EXPECT_EQ(core.load().kv.blocks_used, 0) << "its blocks went back";
}

}  // namespace
}  // namespace kettle

namespace kettle {
namespace {

// Constrained decoding in the step loop: a sequence under a grammar draws only what the
// grammar allows and stops when it is complete; batched with free sequences (rows with and
// without masks in one step) every sequence draws what it draws alone; with drafts to
// verify (speculation), right or wrong, the constrained tokens are the same.
class ConstrainedEngineTest : public EngineCoreTest {
 protected:
  // The golden model's ids 0..255 as single bytes; the rest never allowed.
  std::shared_ptr<grammar::Constraint> constraint(const std::string& gbnf) const {
    std::vector<std::string> bytes(static_cast<size_t>(model_.spec.vocab_size));
    for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
    auto vocab = std::make_shared<grammar::TokenVocabulary>(std::move(bytes), std::vector<int32_t>{});
    return std::make_shared<grammar::Constraint>(grammar::parse_gbnf(gbnf), vocab, "test grammar");
  }
  static std::string text_of(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += static_cast<char>(id);
    return s;
  }
};

TEST_F(ConstrainedEngineTest, OnlyTheGrammarsTokensAloneBatchedAndVerified) {
  const std::string gbnf = "root ::= \"{\" [a-z]{2,6} ( \",\" [0-9]{1,3} ){1,3} \"}\"\n";
  const std::regex shape(R"(\{[a-z]{2,6}(,[0-9]{1,3}){1,3}\})");
  for (const float temperature : {0.0f, 0.9f}) {
    GenerationRequest held = request(64, temperature);
    held.constraint = constraint(gbnf);
    const GenerationResult alone = [&] {
      EngineCore core(model_, nullptr, {backend_.get()}, EngineOptions{});
      return generate(core, held);
    }();
    ASSERT_EQ(alone.end.finish_reason, "stop") << alone.end.error;
    EXPECT_TRUE(std::regex_match(text_of(alone.tokens), shape)) << text_of(alone.tokens);

    // Batched with three free sequences of other prompts.
    EngineOptions options;
    options.batch = 4;
    EngineCore core(model_, nullptr, {backend_.get()}, options);
    std::vector<GenerationRequest> free_requests;
    std::vector<std::shared_ptr<TokenSink>> sinks;
    for (int i = 0; i < 3; ++i) {
      GenerationRequest r = request(24, temperature);
      r.prompt.push_back(100 + i);
      r.sampling.seed = 77 + static_cast<uint64_t>(i);
      free_requests.push_back(r);
      sinks.push_back(std::make_shared<TokenSink>());
      core.submit(r, sinks.back());
    }
    auto held_sink = std::make_shared<TokenSink>();
    core.submit(held, held_sink);
    core.run_until_idle();
    EXPECT_EQ(held_sink->tokens, alone.tokens) << "temperature " << temperature;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(sinks[static_cast<size_t>(i)]->tokens, plain(free_requests[static_cast<size_t>(i)]));

    // Drafts verified in one step: right (the alone run's) or wrong.
    for (const bool right : {true, false}) {
      EngineCore spec(model_, nullptr, {backend_.get()}, EngineOptions{});
      auto sink = std::make_shared<TokenSink>();
      spec.submit(held, sink);
      while (!spec.idle()) {
        for (const auto& seq : spec.scheduler().running_sequences()) {
          if (!seq->decoding() || seq->finished()) continue;
          const auto done = static_cast<size_t>(seq->produced());
          for (size_t i = done; i < std::min(done + 3, alone.tokens.size()); ++i)
            seq->draft().push_back(right ? alone.tokens[i] : '#');
        }
        spec.step();
      }
      EXPECT_EQ(sink->tokens, alone.tokens) << (right ? "right" : "wrong") << " drafts, temperature " << temperature;
    }
  }
}

TEST_F(ConstrainedEngineTest, AGrammarNoTokenCanFollowEndsWithAnErrorNamingIt) {
  // é is two bytes (195, 169) and the vocabulary below has ASCII bytes only.
  GenerationRequest held = request(8);
  auto only_ascii = [&] {
    std::vector<std::string> bytes(static_cast<size_t>(model_.spec.vocab_size));
    for (int b = 0; b < 128; ++b) bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
    auto vocab = std::make_shared<grammar::TokenVocabulary>(std::move(bytes), std::vector<int32_t>{});
    return std::make_shared<grammar::Constraint>(grammar::parse_gbnf("root ::= \"\\u00e9\"\n"), vocab, "test grammar");
  };
  held.constraint = only_ascii();
  EngineCore core(model_, nullptr, {backend_.get()}, EngineOptions{});
  const GenerationResult r = generate(core, held);
  EXPECT_EQ(r.end.finish_reason, "error");
  EXPECT_NE(r.end.error.find("test grammar allows no token"), std::string::npos) << r.end.error;
}

}  // namespace
}  // namespace kettle
