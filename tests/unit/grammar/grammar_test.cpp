// The grammar engine: GBNF parsing and its errors, the automaton on bytes, regular
// expressions against std::regex (ECMAScript) as the reference, the token mask on a
// real tokenizer's vocabulary, and random walks through masks that must end in text
// the grammar's own reference accepts.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <nlohmann/json.hpp>

#include <random>
#include <regex>

#include "grammar/constraint.h"
#include "grammar/gbnf_text.h"
#include "grammar/regex_gbnf.h"
#include "grammar/token_vocabulary.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace kettle::grammar {
namespace {

// A vocabulary of the 256 single bytes (id = byte) and an end id 256.
std::shared_ptr<const TokenVocabulary> byte_vocabulary() {
  std::vector<std::string> bytes(257);
  for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
  return std::make_shared<TokenVocabulary>(std::move(bytes), std::vector<int32_t>{256});
}

bool matches(const std::string& gbnf, std::string_view text) {
  auto c = std::make_shared<Constraint>(parse_gbnf(gbnf), byte_vocabulary(), "test");
  ConstraintMatcher m(c);
  for (char ch : text)
    if (!m.accept(static_cast<uint8_t>(ch))) return false;
  return m.accepting();
}

TEST(Gbnf, LiteralsClassesAndRepetitions) {
  const std::string g = R"(root ::= "a" [0-9]+ ( "x" | "yz" )? [^a-c]{2,3}  # comment
)";
  EXPECT_TRUE(matches(g, "a1dd"));
  EXPECT_TRUE(matches(g, "a123yzdef"));
  EXPECT_FALSE(matches(g, "a1ddd d"));
  EXPECT_FALSE(matches(g, "a1ad"));
  EXPECT_FALSE(matches(g, "ayzdd"));
  EXPECT_FALSE(matches(g, "a1d"));
}

TEST(Gbnf, RulesAcrossLinesAndRecursion) {
  const std::string g = "root ::= list\nlist ::= \"[\" ( item ( \",\" item )* )? \"]\"\nitem ::= [0-9] | list\n";
  EXPECT_TRUE(matches(g, "[]"));
  EXPECT_TRUE(matches(g, "[1,[2,[]],3]"));
  EXPECT_FALSE(matches(g, "[1,]"));
  EXPECT_FALSE(matches(g, "[[1]"));
}

TEST(Gbnf, UnicodeClassesMatchWholeCharacters) {
  const std::string g = "root ::= [α-ω]+ \"é\" .\n";
  EXPECT_TRUE(matches(g, "αβγé😀"));
  EXPECT_FALSE(matches(g, "αβγe😀"));
  EXPECT_FALSE(matches(g, std::string("\xCE", 1) + "é" + "x"));  // half a character
}

TEST(Gbnf, ErrorsNameTheProblem) {
  auto message = [](const std::string& g) {
    try {
      parse_gbnf(g);
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message("root ::= foo\n").find("'foo', which is not defined"), std::string::npos);
  EXPECT_NE(message("start ::= \"a\"\n").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(message("root ::= root \"a\" | \"b\"\n").find("left-recursive"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\nb").find("line 2"), std::string::npos);
  EXPECT_NE(message("root ::= [b-a]").find("wrong way round"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"{5,2}").find("n < m"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"{999999}").find("above"), std::string::npos);
  EXPECT_NE(message("root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')')).find("nested deeper"),
            std::string::npos);
}

TEST(Gbnf, LongRunsKeepOneState) {
  auto c = std::make_shared<Constraint>(parse_gbnf("root ::= \"<\" [a-z]* \">\"\n"), byte_vocabulary(), "test");
  ConstraintMatcher m(c);
  ASSERT_TRUE(m.accept('<'));
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(m.accept('a' + i % 26));
  ASSERT_TRUE(m.accept('>'));
  EXPECT_TRUE(m.complete());
}

TEST(Gbnf, TextWithoutAStopString) {
  const std::string g = "root ::= body \"</think>\"\n" + gbnf_text_without("body", "</think>");
  EXPECT_TRUE(matches(g, "</think>"));
  EXPECT_TRUE(matches(g, "a < b </thin </think>"));
  EXPECT_TRUE(matches(g, "<</</t</th</thi</thin</thinkk</think>"));
  EXPECT_FALSE(matches(g, "a</think>b</think>"));
  // Self-overlapping stops too.
  const std::string h = "root ::= body \"abab\"\n" + gbnf_text_without("body", "abab");
  EXPECT_TRUE(matches(h, "aabaabab"));
  EXPECT_TRUE(matches(h, "ababab"));     // body "ab"
  EXPECT_FALSE(matches(h, "abababab"));  // body "abab" would contain the stop
  EXPECT_TRUE(matches(h, "abaabab"));
}

// Regexes against std::regex (ECMAScript) over every string of a small alphabet.
TEST(Regex, FullMatchAgreesWithStdRegex) {
  const std::vector<std::string> patterns = {
      "a*b", "(ab|a)c?", "[a-c]{2,3}", "a+?b?", "(?:ab)*", "\\d{2}-\\w", "[^b]+", "a|b|", "(a|b)*c(a|b)?",
      ".b.", "[\\d-]{1,2}", "x?y?z?",
  };
  const std::string alphabet = "abcxyz1-";
  std::vector<std::string> texts = {""};
  for (int len = 1; len <= 4; ++len)
    for (size_t i = 0, n = texts.size(); i < n; ++i)
      if (texts[i].size() == static_cast<size_t>(len - 1))
        for (char ch : alphabet) texts.push_back(texts[i] + ch);
  for (const std::string& p : patterns) {
    const std::regex reference(p, std::regex::ECMAScript);
    const std::string g = regex_to_gbnf(p, "root", RegexMode::kFullMatch);
    for (const std::string& t : texts)
      EXPECT_EQ(matches(g, t), std::regex_match(t, reference)) << "pattern " << p << " text '" << t << "'";
  }
}

TEST(Regex, RefusesWhatIsNotRegular) {
  for (const char* p : {"(a)\\1", "a(?=b)", "\\bword", "(a", "a)", "*a", "[a", "a{2"}) {
    EXPECT_THROW(regex_to_gbnf(p, "root", RegexMode::kFullMatch), Error) << p;
  }
}

TEST(Regex, InsideAJsonStringEscapesAndSearches) {
  const std::string rules = "root ::= \"\\\"\" pat \"\\\"\"\nany ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\nt]\n" +
                            regex_to_gbnf("^[a\"]+$", "pat", RegexMode::kJsonString, "any") +
                            regex_to_gbnf("b\\d", "pat2", RegexMode::kJsonString, "any");
  EXPECT_TRUE(matches(rules, "\"a\\\"a\""));
  EXPECT_FALSE(matches(rules, "\"a\"a\""));
  const std::string search = "root ::= pat2\nany ::= [^\"\\\\\\x00-\\x1F]\n" +
                             regex_to_gbnf("b\\d", "pat2", RegexMode::kJsonString, "any");
  EXPECT_TRUE(matches(search, "xxb1yy"));
  EXPECT_FALSE(matches(search, "xxbyy"));
}

// A JSON object grammar with counted repetitions (strings of at most `max_chars`).
std::string small_json_grammar(const std::string& root, int max_chars) {
  return "root ::= " + root + "\n" + R"(ws ::= [ \t\n]{0,4}
json-char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
json-string ::= "\"" json-char{0,)" + std::to_string(max_chars) + R"(} "\""
json-value ::= json-string | "-"? [1-9] [0-9]{0,4} | "true" | "null"
json-object ::= "{" ws ( json-member ws ( "," ws json-member ws ){0,3} )? "}"
json-member ::= json-string ws ":" ws json-value
)";
}

// The demo model's byte-level BPE vocabulary: masks follow the grammar token by token.
class RealVocabulary : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = new Tokenizer(Tokenizer::from_file(KETTLE_TEST_DATA "/../../models/kettle-demo/tokenizer.json"));
    vocab_ = std::make_shared<TokenVocabulary>(TokenVocabulary::from_tokenizer(*tokenizer_, {0}));
  }
  static void TearDownTestSuite() { delete tokenizer_; }

  // Draws allowed tokens at random until the grammar is complete (or `limit` tokens).
  std::string walk(const std::string& gbnf, uint64_t seed, int limit = 400) {
    auto c = std::make_shared<Constraint>(parse_gbnf(gbnf), vocab_, "test");
    ConstraintMatcher m(c);
    std::mt19937_64 rng(seed);
    std::vector<uint32_t> words(static_cast<size_t>((vocab_->size() + 31) / 32));
    std::vector<int32_t> ids;
    for (int step = 0; step < limit && !m.complete(); ++step) {
      m.fill_mask(words);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab_->size(); ++id)
        if ((words[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u) allowed.push_back(id);
      EXPECT_FALSE(allowed.empty());
      if (allowed.empty()) break;
      const int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      if (vocab_->is_end(pick)) break;
      EXPECT_TRUE(m.accept(pick));
      ids.push_back(pick);
    }
    return tokenizer_->decode(ids);
  }

  static Tokenizer* tokenizer_;
  static std::shared_ptr<const TokenVocabulary> vocab_;
};
Tokenizer* RealVocabulary::tokenizer_ = nullptr;
std::shared_ptr<const TokenVocabulary> RealVocabulary::vocab_;

TEST_F(RealVocabulary, TokenBytesDecodeToTheirText) {
  for (int32_t id = 0; id < vocab_->size(); id += 97) {
    if (vocab_->bytes(id).empty()) continue;
    const std::string text = tokenizer_->decode({id});
    if (text.find("\xEF\xBF\xBD") != std::string::npos) continue;  // a partial character
    EXPECT_EQ(vocab_->bytes(id), text) << id;
  }
}

TEST_F(RealVocabulary, MaskHoldsExactlyTheTokensTheGrammarTakes) {
  auto c = std::make_shared<Constraint>(parse_gbnf("root ::= \"ab\" [0-9]* \"c\"\n"), vocab_, "test");
  ConstraintMatcher m(c);
  std::vector<uint32_t> words(static_cast<size_t>((vocab_->size() + 31) / 32));
  m.fill_mask(words);
  // Reference: a token is allowed iff its bytes are a prefix of some sentence "ab[0-9]*c".
  const std::regex prefix("^(a|ab[0-9]*c?)$");
  int allowed = 0;
  for (int32_t id = 0; id < vocab_->size(); ++id) {
    const bool bit = (words[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
    const std::string& b = vocab_->bytes(id);
    const bool expect = !b.empty() && !vocab_->is_end(id) && std::regex_match(b, prefix);
    EXPECT_EQ(bit, expect) << id << " '" << b << "'";
    allowed += bit;
  }
  EXPECT_GT(allowed, 0);
}

TEST_F(RealVocabulary, RandomWalksThroughAJsonGrammarEndInJson) {
  const std::string g = small_json_grammar("json-object", 12);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const std::string text = walk(g, seed);
    EXPECT_TRUE(nlohmann::json::accept(text)) << text;
  }
}

// The engine fills the masks of one schema's rows on several threads at once: each
// thread's matcher gets exactly the masks that a private, single-threaded constraint
// gives for the same tokens — also while the shared tables are dropped and rebuilt
// (max_states 64 forces resets mid-run) and the mask cache evicts.
TEST_F(RealVocabulary, MatchersOnManyThreadsGetOneThreadsMasks) {
  const std::string g = small_json_grammar("( json-object \"\\n\" )+", 40);
  for (size_t max_states : {size_t{64}, Constraint::kMaxStates}) {
    auto shared = std::make_shared<Constraint>(parse_gbnf(g), vocab_, "shared", max_states);
    const size_t words = static_cast<size_t>((vocab_->size() + 31) / 32);
    std::atomic<int> mismatches{0}, steps{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&, t] {
        auto own = std::make_shared<Constraint>(parse_gbnf(g), vocab_, "own");
        ConstraintMatcher a(shared), b(own);
        std::mt19937_64 rng(static_cast<uint64_t>(t) + 1);
        std::vector<uint32_t> ma(words), mb(words);
        for (int step = 0; step < 150; ++step) {
          a.fill_mask(ma);
          b.fill_mask(mb);
          if (ma != mb) ++mismatches;
          std::vector<int32_t> allowed;
          for (int32_t id = 0; id < vocab_->size(); ++id)
            if (!vocab_->is_end(id) && ((mb[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u)) allowed.push_back(id);
          if (allowed.empty()) break;
          const int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
          if (!a.accept(pick) || !b.accept(pick)) ++mismatches;
          ++steps;
        }
      });
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(mismatches.load(), 0) << "max_states " << max_states;
    EXPECT_EQ(steps.load(), 8 * 150);
  }
}

}  // namespace
}  // namespace kettle::grammar

namespace kettle::grammar {
namespace {

// A grammar whose live parses grow with the input (each 'a' may or may not owe a 'b') is
// refused by the matcher once past its bounds, with an error, not by exhausting memory.
TEST(Gbnf, AnAmbiguityBombIsRefusedNotFollowed) {
  auto c = std::make_shared<Constraint>(parse_gbnf("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x | \"\"\n"),
                                        byte_vocabulary(), "bomb");
  ConstraintMatcher m(c);
  int taken = 0;
  EXPECT_THROW(
      {
        for (; taken < 100000; ++taken) ASSERT_TRUE(m.accept('a'));
      },
      Error);
  EXPECT_GT(taken, 1000);  // an honest run of a's is followed a long way first
}

}  // namespace
}  // namespace kettle::grammar
