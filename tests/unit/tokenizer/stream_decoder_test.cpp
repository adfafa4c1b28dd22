// StreamDecoder: pushes never emit half a character and concatenate to
// decode(all ids); StopMatcher: stop strings split across pushes.
#include "tokenizer/stream_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kettle {
namespace {

const std::string kDir = std::string(KETTLE_TEST_DATA) + "/tokenizers/";

std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids,
                       std::vector<std::string>* pieces = nullptr, bool skip_special = false) {
  StreamDecoder stream(tok, skip_special);
  std::string out;
  for (int32_t id : ids) {
    std::string piece = stream.push(id);
    EXPECT_TRUE(unicode::is_valid_utf8(piece));
    if (pieces) pieces->push_back(piece);
    out += piece;
  }
  out += stream.finish();
  return out;
}

TEST(StreamDecoder, EmojiSplitAcrossByteFallbackTokens) {
  const Tokenizer tok = Tokenizer::from_file(kDir + "sentencepiece.json");
  const auto ids = tok.encode("hello ü😀 abc", false);
  ASSERT_GT(ids.size(), 8u);  // ü and 😀 are byte-fallback tokens: 2 + 4 ids
  std::vector<std::string> pieces;
  EXPECT_EQ(stream_all(tok, ids, &pieces), tok.decode(ids));
  // No piece holds a replacement character: bytes were held until complete.
  for (const auto& p : pieces) EXPECT_EQ(p.find("\xEF\xBF\xBD"), std::string::npos) << p;
  // The emoji comes out whole, in a single push (with the token that ended the byte run).
  EXPECT_TRUE(std::any_of(pieces.begin(), pieces.end(),
                          [](const std::string& p) { return p.find("\xF0\x9F\x98\x80") != std::string::npos; }));
}

TEST(StreamDecoder, ByteLevelMultiByteCharacters) {
  const Tokenizer tok = Tokenizer::from_file(kDir + "byte_level.json");
  const std::string text = "hello world café 😀 👨‍👩‍👧 ok";
  const auto ids = tok.encode(text, false);
  std::vector<std::string> pieces;
  EXPECT_EQ(stream_all(tok, ids, &pieces), tok.decode(ids));
  for (const auto& p : pieces) EXPECT_EQ(p.find("\xEF\xBF\xBD"), std::string::npos) << p;
}

TEST(StreamDecoder, LongStreamsSlideTheWindow) {
  const Tokenizer tok = Tokenizer::from_file(kDir + "sentencepiece.json");
  std::string text;
  for (int i = 0; i < 50; ++i) text += "hello abc é ü ";
  const auto ids = tok.encode(text, true);
  EXPECT_EQ(stream_all(tok, ids), tok.decode(ids));
  EXPECT_EQ(stream_all(tok, ids, nullptr, true), tok.decode(ids, true));
}

TEST(StreamDecoder, RandomByteLevelIdsMatchFullDecode) {
  const Tokenizer tok = Tokenizer::from_file(kDir + "byte_level.json");
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(tok.vocab_size()) - 1);
  for (int round = 0; round < 50; ++round) {
    std::vector<int32_t> ids(200);
    for (auto& id : ids) id = pick(rng);
    EXPECT_EQ(stream_all(tok, ids), tok.decode(ids)) << "round " << round;
  }
}

TEST(StreamDecoder, FinishFlushesAnUnfinishedCharacter) {
  const Tokenizer tok = Tokenizer::from_file(kDir + "sentencepiece.json");
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.push(*tok.token_to_id("<0xF0>")), "");
  EXPECT_EQ(stream.push(*tok.token_to_id("<0x9F>")), "");
  EXPECT_EQ(stream.finish(), tok.decode({*tok.token_to_id("<0xF0>"), *tok.token_to_id("<0x9F>")}));
}

TEST(StopMatcher, StopStringSplitAcrossPushes) {
  StopMatcher m({"</answer>", "STOP"});
  std::string out;
  out += m.push("The result is 4");
  out += m.push("2.</ans");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(out, "The result is 42.");  // "</ans" is held back
  out += m.push("wer> trailing");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</answer>");
  EXPECT_EQ(out, "The result is 42.");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("ST"), "");
  EXPECT_EQ(m.push("OAT"), "STOAT");
  EXPECT_EQ(m.push("S"), "");
  EXPECT_EQ(m.push("T"), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.finish(), "ST");
}

TEST(StopMatcher, EarliestStopWinsAndOverlapsAreHeld) {
  StopMatcher m({"bcd", "ab"});
  EXPECT_EQ(m.push("xa"), "x");
  EXPECT_EQ(m.push("bcd"), "");  // "ab" starts before "bcd": the earliest stop wins
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "ab");
}

TEST(StopMatcher, MultiByteStopAndEmptyStops) {
  StopMatcher m({"", "\xE3\x80\x82"});  // "。"
  EXPECT_EQ(m.push("\xE4\xBD\xA0\xE5\xA5\xBD"), "\xE4\xBD\xA0\xE5\xA5\xBD");
  EXPECT_EQ(m.push("\xE3\x80\x82rest"), "");
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace kettle
