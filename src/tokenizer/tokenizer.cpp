// Tokenizer: reads tokenizer.json, wires the pipeline (added tokens → normalizer
// → pre-tokenizer → BPE → post-processor) and runs it as HF's
// encode_single_sequence does; decode maps ids to token strings for the decoder.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/components.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace kettle {

using nlohmann::json;

struct Tokenizer::Impl {
  std::string path;
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tok::BpeModel> model;
  std::unique_ptr<tok::AddedVocab> added;
  std::unique_ptr<tok::PostProcessor> post_processor;
  std::unique_ptr<tok::Decoder> decoder;
};

namespace {

std::string resolve_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path file = fs::path(path) / "tokenizer.json";
    if (!fs::exists(file, ec)) fail(ErrorCategory::kNotFound, "{}: folder has no tokenizer.json", path);
    return file.string();
  }
  if (!fs::exists(path, ec)) fail(ErrorCategory::kNotFound, "{}: no such tokenizer file or folder", path);
  return path;
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCategory::kNotFound, "{}: cannot open", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return json::parse(buffer.str());
  } catch (const json::exception& e) {
    fail(ErrorCategory::kInvalidData, "{}: not valid JSON: {}", path, e.what());
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path_in) {
  auto impl = std::make_unique<Impl>();
  impl->path = resolve_path(path_in);
  const std::string& where = impl->path;
  const json j = read_json(where);
  try {
    const json null;
    auto field = [&](const char* key) -> const json& { return j.contains(key) ? j[key] : null; };
    const json& model = field("model");
    if (!model.is_object()) fail(ErrorCategory::kInvalidData, "{}: has no \"model\" object", where);
    const std::string type = model.value("type", model.contains("merges") ? "BPE" : "");
    if (type != "BPE")
      fail(ErrorCategory::kUnsupported, "{}: model type \"{}\" is not supported (only BPE)", where,
           type.empty() ? "unknown" : type);
    impl->normalizer = tok::make_normalizer(field("normalizer"), where);
    // Raw-byte BPE works when ByteLevel is the last pre-tokenizer and no
    // prefix/suffix decorates the characters.
    auto decorated = [&](const char* key) {
      return model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty();
    };
    const bool can_defer = !decorated("continuing_subword_prefix") && !decorated("end_of_word_suffix");
    bool byte_level = false;
    impl->pre_tokenizer = tok::make_pre_tokenizer(field("pre_tokenizer"), where, can_defer, byte_level);
    impl->model = std::make_unique<tok::BpeModel>(model, where, byte_level);
    impl->added = std::make_unique<tok::AddedVocab>(field("added_tokens"), impl->normalizer.get(), where);
    impl->post_processor = tok::make_post_processor(field("post_processor"), where);
    impl->decoder = tok::make_decoder(field("decoder"), where);
  } catch (const json::exception& e) {
    fail(ErrorCategory::kInvalidData, "{}: malformed tokenizer: {}", where, e.what());
  }
  return Tokenizer(std::move(impl));
}

namespace {

// Special tokens that start inside a literal span become text again, joined with the
// text around them, so the span is encoded as if the token did not exist.
void unsplit_literals(const std::vector<Tokenizer::Span>& literal, const tok::AddedVocab& added,
                      std::vector<tok::Segment>& segments) {
  if (literal.empty()) return;
  std::vector<tok::Segment> out;
  for (tok::Segment seg : segments) {
    if (seg.id >= 0) {
      const tok::AddedToken* t = added.by_id(seg.id);
      const bool inside = std::any_of(literal.begin(), literal.end(), [&](const Tokenizer::Span& s) {
        return seg.begin < s.end && seg.end > s.begin;
      });
      if (t && t->special && inside) seg.id = -1;
    }
    if (seg.id < 0 && !out.empty() && out.back().id < 0 && out.back().end == seg.begin)
      out.back().end = seg.end;
    else
      out.push_back(seg);
  }
  segments = std::move(out);
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view raw, bool add_special_tokens,
                                       const std::vector<Span>& literal) const {
  const Impl& m = *impl_;
  std::string repaired;
  const std::string_view text = unicode::repair_utf8(raw, repaired);

  tok::PieceList list;
  list.text.reserve(text.size() + text.size() / 4 + 16);
  std::vector<tok::Segment> segments, sub;
  m.added->split(text, /*normalized=*/false, segments);
  unsplit_literals(literal, *m.added, segments);
  std::string normalized;
  for (const tok::Segment& seg : segments) {
    if (seg.id >= 0) {
      list.pieces.push_back(tok::Piece{0, 0, seg.id, false});
      continue;
    }
    const std::string_view part = text.substr(seg.begin, seg.end - seg.begin);
    const auto base = static_cast<uint32_t>(list.text.size());
    if (m.normalizer) {
      normalized.assign(part);
      m.normalizer->normalize(normalized);
      list.text += normalized;
    } else {
      list.text += part;
    }
    const std::string_view norm = std::string_view(list.text).substr(base);
    sub.clear();
    m.added->split(norm, /*normalized=*/true, sub);
    for (const tok::Segment& s : sub) {
      if (s.id >= 0)
        list.pieces.push_back(tok::Piece{0, 0, s.id, false});
      else
        list.pieces.push_back(tok::Piece{base + s.begin, base + s.end, -1, seg.begin == 0 && s.begin == 0});
    }
  }
  if (m.pre_tokenizer) m.pre_tokenizer->pre_tokenize(list);

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  for (const tok::Piece& p : list.pieces) {
    if (p.added_id >= 0)
      ids.push_back(p.added_id);
    else
      m.model->tokenize(list.view(p), ids);
  }
  if (add_special_tokens && m.post_processor) m.post_processor->process(ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = nullptr;
    if (const tok::AddedToken* a = m.added->by_id(id))
      token = &a->content;
    else
      token = m.model->id_to_token(id);
    if (token == nullptr) continue;
    if (skip_special_tokens && m.added->is_special_content(*token)) continue;
    tokens.push_back(*token);
  }
  std::string out;
  if (m.decoder) {
    m.decoder->decode_chain(tokens);
    for (const std::string& t : tokens) out += t;
  } else {
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k > 0) out += ' ';
      out += tokens[k];
    }
  }
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added->id_of(token)) return id;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const tok::AddedToken* a = impl_->added->by_id(id)) return a->content;
  const std::string* t = impl_->model->id_to_token(id);
  return t ? *t : std::string();
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const Impl& m = *impl_;
  if (const tok::AddedToken* a = m.added->by_id(id)) return a->special ? std::string() : a->content;
  const std::string* token = m.model->id_to_token(id);
  if (token == nullptr) return {};
  std::string piece = *token;
  if (m.decoder) m.decoder->raw_piece(piece);
  return piece;
}

int64_t Tokenizer::vocab_size() const {
  return std::max<int64_t>(impl_->model->size(), int64_t{impl_->added->max_id()} + 1);
}

bool Tokenizer::is_special(int32_t id) const {
  const tok::AddedToken* a = impl_->added->by_id(id);
  return a != nullptr && a->special;
}

std::vector<std::string> Tokenizer::special_token_strings() const {
  std::vector<std::string> out;
  for (const tok::AddedToken& t : impl_->added->tokens())
    if (t.special && !t.content.empty()) out.push_back(t.content);
  return out;
}

}  // namespace kettle
