// Tokenizer against Hugging Face on hand-made tokenizer.json files (one per
// component family; expected.json holds what the native HF tokenizers produced,
// see tests/data/tokenizers/make_tokenizers.mjs), plus loading and error cases.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "tokenizer/unicode.h"
#include "util/error.h"

namespace kettle {
namespace {

const std::string kDir = std::string(KETTLE_TEST_DATA) + "/tokenizers/";

const Tokenizer& load(const std::string& file) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[file];
  if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::from_file(kDir + file));
  return *slot;
}

nlohmann::json expected_cases() {
  std::ifstream in(kDir + "expected.json");
  return nlohmann::json::parse(in);
}

TEST(Tokenizer, MatchesHuggingFaceOnEveryHandMadeCase) {
  const nlohmann::json cases = expected_cases();
  ASSERT_GT(cases.size(), 50u);
  for (const auto& c : cases) {
    const Tokenizer& tok = load(c["file"]);
    const std::string text = c["text"];
    SCOPED_TRACE(c["file"].get<std::string>() + " on \"" + text + "\"");
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, true), ids);
    EXPECT_EQ(tok.encode(text, false), c["ids_no_special"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok.decode(ids, false), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip_special"].get<std::string>());
  }
}

TEST(Tokenizer, VocabQueries) {
  const Tokenizer& tok = load("byte_level.json");
  ASSERT_TRUE(tok.token_to_id("<mask>").has_value());
  const int32_t mask = *tok.token_to_id("<mask>");
  EXPECT_TRUE(tok.is_special(mask));
  EXPECT_FALSE(tok.is_special(*tok.token_to_id("<tool>")));
  EXPECT_FALSE(tok.is_special(*tok.token_to_id("Ġw")));
  EXPECT_EQ(tok.id_to_token(mask), "<mask>");
  EXPECT_EQ(tok.id_to_token(*tok.token_to_id("Ġworld")), "Ġworld");
  EXPECT_EQ(tok.id_to_token(-1), "");
  EXPECT_EQ(tok.id_to_token(1 << 30), "");
  EXPECT_FALSE(tok.token_to_id("not a token").has_value());
  EXPECT_EQ(tok.vocab_size(), int64_t{*tok.token_to_id("<tool>")} + 1);
  EXPECT_EQ(tok.decode({1 << 30, -5}), "");  // unknown ids are skipped, as in HF
}

TEST(Tokenizer, InvalidUtf8IsReadAsReplacementCharacters) {
  const Tokenizer& tok = load("byte_level.json");
  // "a\xFFb" must encode like "a\uFFFDb" (String::from_utf8_lossy).
  EXPECT_EQ(tok.encode("a\xFF"
                       "b"),
            tok.encode("a\xEF\xBF\xBD"
                       "b"));
  // (this tokenizer adds a prefix space)
  EXPECT_EQ(tok.decode(tok.encode("a\xFF"
                                  "b",
                                  false)),
            " a\xEF\xBF\xBD"
            "b");
  // A truncated 3-byte sequence is one U+FFFD (maximal subpart), a surrogate three.
  std::string storage;
  EXPECT_EQ(unicode::repair_utf8("\xE2\x82 x", storage), "\xEF\xBF\xBD x");
  EXPECT_EQ(unicode::repair_utf8("\xED\xA0\x80", storage), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::repair_utf8("\xF0\x9F\x98\x80", storage), "\xF0\x9F\x98\x80");
}

TEST(Tokenizer, LoadsFromAFolder) {
  const auto dir = std::filesystem::temp_directory_path() / "kettle_tok_folder";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kDir + "sentencepiece.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  const Tokenizer tok = Tokenizer::from_file(dir.string());
  EXPECT_EQ(tok.encode("hello"), load("sentencepiece.json").encode("hello"));
}

ErrorCategory category_of(const std::string& path) {
  try {
    Tokenizer::from_file(path);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.substr(path.rfind('/') + 1)), std::string::npos) << e.what();
    return e.category();
  }
  ADD_FAILURE() << path << " loaded";
  return ErrorCategory::kInternal;
}

std::string write_temp(const std::string& name, const nlohmann::json& j) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << j.dump();
  return path.string();
}

TEST(Tokenizer, RejectsWhatItCannotRun) {
  EXPECT_EQ(category_of("/nonexistent/tokenizer.json"), ErrorCategory::kNotFound);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(kDir + "whitespace.json"));
  j["model"] = {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}, {"unk_token", "a"}};
  EXPECT_EQ(category_of(write_temp("kettle_wordpiece.json", j)), ErrorCategory::kUnsupported);
  j = nlohmann::json::parse(std::ifstream(kDir + "whitespace.json"));
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  EXPECT_EQ(category_of(write_temp("kettle_scripts.json", j)), ErrorCategory::kUnsupported);
  j = nlohmann::json::parse(std::ifstream(kDir + "whitespace.json"));
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", ""}};
  EXPECT_EQ(category_of(write_temp("kettle_precompiled.json", j)), ErrorCategory::kUnsupported);
  j = nlohmann::json::parse(std::ifstream(kDir + "whitespace.json"));
  j["model"]["merges"] = {"a zz"};
  EXPECT_EQ(category_of(write_temp("kettle_badmerge.json", j)), ErrorCategory::kInvalidData);
  const auto broken = std::filesystem::temp_directory_path() / "kettle_broken.json";
  std::ofstream(broken) << "{ not json";
  EXPECT_EQ(category_of(broken.string()), ErrorCategory::kInvalidData);
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const Tokenizer& tok = load("byte_level.json");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "hello world " + std::to_string(i) + " wörd ";
  const auto want = tok.encode(text);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int k = 0; k < 20; ++k)
        if (tok.encode(text) != want) ++mismatches;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Tokenizer, IsMovable) {
  Tokenizer a = Tokenizer::from_file(kDir + "sentencepiece.json");
  const auto ids = a.encode("hello");
  Tokenizer b = std::move(a);
  EXPECT_EQ(b.encode("hello"), ids);
}

}  // namespace
}  // namespace kettle
