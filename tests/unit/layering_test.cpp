// The layer DAG, read from the sources: every #include "layer/..." in src/X/
// names X itself or a layer X may depend on (the libraries' links check the
// same from the other side: a call across the DAG the wrong way fails to link).
// The server talks to the engine through its narrow interface only.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

namespace {

namespace fs = std::filesystem;

// Each layer and the layers below it that it may include.
const std::map<std::string, std::set<std::string>> kMayInclude = {
    {"util", {}},
    {"tensor", {"util"}},
    {"backend", {"tensor", "util"}},
    {"kv", {"backend", "tensor", "util"}},
    {"model", {"kv", "backend", "tensor", "util"}},
    {"tokenizer", {"util"}},
    {"chat", {"tokenizer", "util"}},
    {"grammar", {"tokenizer", "util"}},
    {"engine", {"model", "kv", "backend", "tensor", "grammar", "tokenizer", "util"}},
    {"server", {"engine", "chat", "grammar", "tokenizer", "util"}},
    {"cli", {"server", "engine", "model", "kv", "backend", "tensor", "chat", "grammar", "tokenizer", "util"}},
};

// The engine headers the server may include: requests, sinks, the engine's thread, its load.
const std::set<std::string> kEngineInterface = {"engine/engine.h", "engine/engine_load.h", "engine/engine_options.h",
                                                "engine/request.h", "engine/sampler.h", "engine/embedding.h"};

TEST(Layering, EveryIncludeFollowsTheLayerDag) {
  const fs::path src = fs::path(KETTLE_SOURCE_DIR) / "src";
  const std::regex include(R"re(^\s*#\s*include\s*"([a-z_]+)/([^"]+)")re");
  int checked = 0;
  for (const auto& [layer, allowed] : kMayInclude) {
    ASSERT_TRUE(fs::is_directory(src / layer)) << layer;
    for (const auto& entry : fs::recursive_directory_iterator(src / layer)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        std::smatch m;
        if (!std::regex_search(line, m, include)) continue;
        const std::string target = m[1];
        if (!kMayInclude.contains(target)) continue;  // not a layer (e.g. a generated header)
        ++checked;
        EXPECT_TRUE(target == layer || allowed.contains(target))
            << entry.path().string() << ":" << n << " (" << layer << ") includes " << target << "/" << m[2];
        if (layer == "server" && target == "engine") {
          EXPECT_TRUE(kEngineInterface.contains(target + "/" + std::string(m[2])))
              << entry.path().string() << ":" << n << " reaches past the engine's interface: " << line;
        }
      }
    }
  }
  EXPECT_GT(checked, 200);
  for (const auto& dir : fs::directory_iterator(src)) {
    if (dir.is_directory()) {
      EXPECT_TRUE(kMayInclude.contains(dir.path().filename().string())) << "a layer the DAG lacks: " << dir.path();
    }
  }
}

}  // namespace
