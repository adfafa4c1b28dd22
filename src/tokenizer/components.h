// The pipeline stages of a Hugging Face tokenizer.json (normalizer, pre-tokenizer,
// post-processor, decoder) as small interfaces, and the factories that build them
// from their JSON objects. The BPE model and added tokens live in their own files.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace kettle::tok {

// One span of the text being pre-tokenized. Spans index PieceList::text; an
// added token found earlier keeps its id and is passed through untouched.
struct Piece {
  uint32_t begin = 0;
  uint32_t end = 0;
  int32_t added_id = -1;
  bool at_start = false;  // begins at offset 0 of the original input (Metaspace "first")
};

struct PieceList {
  std::string text;
  std::vector<Piece> pieces;
  std::string_view view(const Piece& p) const { return std::string_view(text).substr(p.begin, p.end - p.begin); }
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites s (valid UTF-8) in place.
  virtual void normalize(std::string& s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits (and possibly rewrites) every piece that is not an added token.
  virtual void pre_tokenize(PieceList& list) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;  // only called with add_special_tokens
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF's decode_chain: token strings in, token strings out; the caller joins them.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // One token's bytes as they appear in the middle of a text (no lossy UTF-8 repair,
  // no strip of the text's start): what a grammar matches a token against.
  virtual void raw_piece(std::string& token) const = 0;
};

// `where` names the file in errors. A null/absent JSON value gives nullptr.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);
// `defer_byte_level`: a trailing ByteLevel step leaves bytes unmapped because the
// model works on raw bytes (see BpeModel); set to whether that happened.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where,
                                                 bool allow_defer_byte_level, bool& deferred_byte_level);
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j, const std::string& where);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where);

// GPT-2's byte ↔ printable-character table used by ByteLevel.
const std::string& byte_to_unicode(unsigned char b);  // the UTF-8 of the char standing for byte b
int byte_from_unicode(char32_t c);                    // -1 when c stands for no byte

}  // namespace kettle::tok
