// Shared flag parsing helpers.
#include "cli/options.h"

#include <charconv>

#include "util/error.h"
#include "util/log.h"
#include "util/thread_pool.h"

namespace kettle::cli {

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    int64_t value = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || value < 0 || value > INT32_MAX)
      fail(ErrorCategory::kInvalidArgument, "{}: '{}' is not a token id (expected comma-separated non-negative integers)",
           flag, item);
    ids.push_back(static_cast<int32_t>(value));
    pos = comma + 1;
  }
  return ids;
}

nlohmann::ordered_json parse_template_vars(const std::vector<std::string>& vars) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& item : vars) {
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      fail(ErrorCategory::kInvalidArgument, "--var {}: expected NAME=VALUE", item);
    std::string value = item.substr(eq + 1);
    nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(value, nullptr, false);
    out[item.substr(0, eq)] = parsed.is_discarded() ? nlohmann::ordered_json(value) : parsed;
  }
  return out;
}

std::string default_model_dir() { return KETTLE_DEFAULT_MODEL; }

std::string model_or_default(const std::string& model) {
  if (!model.empty()) return model;
  log::info("no --model given: using the bundled demo model {}", default_model_dir());
  return default_model_dir();
}

void ThreadOption::add_to(CLI::App& app) {
  app.add_option("-t,--threads", threads, "CPU threads (0: one per available core)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

int ThreadOption::resolve() const { return threads > 0 ? threads : ThreadPool::default_threads(); }

}  // namespace kettle::cli
