#include "server/embeddings_protocol.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>

#include "server/request_fields.h"

namespace kettle::server {

namespace {

std::vector<int32_t> token_list(const ordered_json& ids, const std::string& where, int64_t vocab_size) {
  if (ids.empty()) bad_field(where, "a non-empty list of token ids");
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (const ordered_json& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size)
      bad_field(where, fmt::format("token ids in [0, {})", vocab_size));
    out.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return out;
}

void read_input(const ordered_json& input, int64_t vocab_size, EmbeddingsParams& p) {
  const std::string kList = "a string, a list of strings, a list of token ids, or a list of such lists";
  if (input.is_string()) {
    if (input.get_ref<const std::string&>().empty()) bad_field("input", "a non-empty string");
    p.texts.push_back(input.get<std::string>());
    return;
  }
  if (!input.is_array() || input.empty()) bad_field("input", kList + " (not empty)");
  if (input.size() > kMaxEmbeddingInputs) bad_field("input", fmt::format("at most {} inputs", kMaxEmbeddingInputs));
  if (input[0].is_number_integer()) {
    p.token_inputs.push_back(token_list(input, "input", vocab_size));
    return;
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const ordered_json& item = input[i];
    const std::string where = fmt::format("input[{}]", i);
    if (item.is_string() && p.token_inputs.empty()) {
      if (item.get_ref<const std::string&>().empty()) bad_field(where, "a non-empty string");
      p.texts.push_back(item.get<std::string>());
    } else if (item.is_array() && p.texts.empty()) {
      p.token_inputs.push_back(token_list(item, where, vocab_size));
    } else {
      bad_field(where, "the same kind as input[0]: " + kList);
    }
  }
}

}  // namespace

EmbeddingsParams parse_embeddings_request(const ordered_json& body, int64_t vocab_size) {
  EmbeddingsParams p;
  (void)string_field(body, "model");
  (void)string_field(body, "user");
  const ordered_json* input = field(body, "input");
  if (input == nullptr) bad_field("input", "the text (or token ids) to embed");
  read_input(*input, vocab_size, p);
  if (const std::optional<std::string> format = string_field(body, "encoding_format")) {
    if (*format != "float" && *format != "base64") bad_field("encoding_format", "\"float\" or \"base64\"");
    p.base64 = *format == "base64";
  }
  p.dimensions = int_field(body, "dimensions", 1, 1 << 20).value_or(0);
  p.prompt_name = string_field(body, "prompt_name").value_or("");
  if (!p.prompt_name.empty() && !p.token_inputs.empty())
    bad_field("prompt_name", "absent with token-id inputs (a prompt is text put before a text input)");
  return p;
}

std::string base64_encode(const void* bytes, size_t size) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* in = static_cast<const unsigned char*>(bytes);
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  for (size_t i = 0; i < size; i += 3) {
    const uint32_t chunk = (uint32_t{in[i]} << 16) | (i + 1 < size ? uint32_t{in[i + 1]} << 8 : 0) |
                           (i + 2 < size ? uint32_t{in[i + 2]} : 0);
    out += kAlphabet[(chunk >> 18) & 63];
    out += kAlphabet[(chunk >> 12) & 63];
    out += i + 1 < size ? kAlphabet[(chunk >> 6) & 63] : '=';
    out += i + 2 < size ? kAlphabet[chunk & 63] : '=';
  }
  return out;
}

std::string embeddings_response(const std::string& model_id, const std::vector<std::vector<float>>& embeddings,
                                bool base64, int64_t prompt_tokens) {
  static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");
  ordered_json data = ordered_json::array();
  for (size_t i = 0; i < embeddings.size(); ++i) {
    const std::vector<float>& e = embeddings[i];
    ordered_json value = base64 ? ordered_json(base64_encode(e.data(), e.size() * sizeof(float))) : ordered_json(e);
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(value)}});
  }
  const ordered_json body = {{"object", "list"},
                             {"data", std::move(data)},
                             {"model", model_id},
                             {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
  return body.dump();
}

}  // namespace kettle::server
