// Reads a request body as JSON in time linear in its size, with its nesting
// bounded: nlohmann's own DOM parser inserts each key of an ordered object
// with a linear search (a 100,000-key object costs minutes), and everything
// downstream (copies, dump, the template's values) recurses once per level.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string_view>

namespace kettle::server {

struct JsonLimits {
  int max_depth = 64;                 // objects and arrays nested inside each other
  size_t max_values = size_t{1} << 21;  // every value, scalar or container
};

// The document, or ApiError 400 naming what was wrong (syntax with its byte
// offset, too deep, too many values). A key given twice keeps its first
// position and its last value, as nlohmann's parser does.
nlohmann::ordered_json read_json(std::string_view text, const JsonLimits& limits = {});

}  // namespace kettle::server
