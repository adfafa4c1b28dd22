// Typed reads of request-body fields shared by the OpenAI and Anthropic
// parsers. Each check names the field in its ApiError (400) so a client sees
// exactly what was wrong; a JSON null counts as absent.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"

namespace kettle::server {

using ordered_json = nlohmann::ordered_json;

[[noreturn]] void bad_field(const std::string& field, const std::string& expected);

// The value of `name`, or nullptr when absent or null.
const ordered_json* field(const ordered_json& body, const char* name);
// True when `object` is an object whose `name` is the string `value` (any other type,
// or none, is false: a client's wrong type must not throw past the parser).
bool field_is(const ordered_json& object, const char* name, std::string_view value);

std::optional<double> number_field(const ordered_json& body, const char* name, double lo, double hi);
std::optional<int64_t> int_field(const ordered_json& body, const char* name, int64_t lo, int64_t hi = INT64_MAX);
std::optional<bool> bool_field(const ordered_json& body, const char* name);
std::optional<std::string> string_field(const ordered_json& body, const char* name);
// A string or an array of at most `max_count` strings (OpenAI `stop`, Anthropic `stop_sequences`).
std::vector<std::string> string_list_field(const ordered_json& body, const char* name, size_t max_count);

// `cache_salt` (vLLM's field, any API): a non-empty string of at most 256 bytes, or absent.
std::string cache_salt_field(const ordered_json& body);

// Parses a request body into a JSON object; anything else is ApiError 400.
ordered_json parse_body(const std::string& body);

}  // namespace kettle::server
