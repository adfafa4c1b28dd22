// Flag values shared by commands, and their parsing into typed values with
// one-line errors naming the flag.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kettle::cli {

// "1,2,3" (spaces allowed) → ids; an error names the flag and the bad item.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag);

struct ThreadOption {
  int threads = 0;  // 0: all cores
  void add_to(CLI::App& app);
  int resolve() const;
};

}  // namespace kettle::cli
