// Every top-level field each route takes, in one table: applied (the parser
// reads it and it changes what is generated or returned), informational (a
// tag or identifier with nothing to apply: `user`, `metadata`), or refused
// with the reason (a refused field's neutral value, which asks for nothing kettle
// does not do anyway, is taken). A field in no row is refused as unknown, naming it, as
// OpenAI's API does: a request field is applied or refused, never accepted
// and ignored. Checks of a field's value stay with the route's parser.
#pragma once

#include <nlohmann/json.hpp>

#include <string_view>
#include <vector>

namespace kettle::server {

enum class Route { kChatCompletions, kCompletions, kAnthropicMessages, kResponses, kEmbeddings };

enum class FieldUse { kApplied, kInformational, kRefused };

struct FieldRule {
  std::string_view name;
  FieldUse use;
  std::string_view note;  // refused: why (completes "'<name>' is not supported: ..."); else what it does
  // Refused fields: the JSON value that asks for what kettle does anyway (echo false,
  // best_of 1), taken as applied; empty: none.
  std::string_view neutral = {};
};

const std::vector<FieldRule>& field_rules(Route route);

// ApiError 400 naming the first refused or unknown top-level field of `body` (an object).
void check_fields(const nlohmann::ordered_json& body, Route route);

}  // namespace kettle::server
