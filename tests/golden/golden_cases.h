// The golden cases (tests/data/goldens: tiny random models with their model/;
// tests/data/goldens-demo: the bundled demo models) and their reference
// outputs from Hugging Face transformers, shared by the CPU and CUDA checks.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace kettle::golden {

namespace fs = std::filesystem;

// A case is "goldens/<name>" or "goldens-demo/<name>".
inline std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const char* set : {"goldens", "goldens-demo"})
    for (auto& entry : fs::directory_iterator(fs::path(KETTLE_TEST_DATA) / set))
      if (fs::exists(entry.path() / "golden.json")) names.push_back(std::string(set) + "/" + entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline fs::path case_dir(const std::string& name) { return fs::path(KETTLE_TEST_DATA) / name; }

// Tiny cases carry their model; demo cases point at the bundled model of the same name.
inline std::string model_dir(const std::string& name) {
  fs::path own = case_dir(name) / "model";
  if (fs::exists(own)) return own.string();
  return (fs::path(KETTLE_TEST_DATA) / ".." / ".." / "models" / case_dir(name).filename()).string();
}

struct Golden {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
  int64_t positions = 0, vocab = 0;
  std::vector<float> logits;
};

inline Golden read_golden(const fs::path& dir) {
  std::ifstream in(dir / "golden.json");
  nlohmann::json j = nlohmann::json::parse(in);
  Golden g;
  g.prompt = j["prompt_ids"].get<std::vector<int32_t>>();
  g.greedy = j["greedy_new_tokens"].get<std::vector<int32_t>>();
  g.positions = j["logits_shape"][0].get<int64_t>();
  g.vocab = j["logits_shape"][1].get<int64_t>();
  g.logits.resize(static_cast<size_t>(g.positions * g.vocab));
  std::ifstream lf(dir / j["logits_file"].get<std::string>(), std::ios::binary);
  lf.read(reinterpret_cast<char*>(g.logits.data()), static_cast<std::streamsize>(g.logits.size() * sizeof(float)));
  EXPECT_TRUE(lf.good()) << "short logits file in " << dir;
  return g;
}

inline double relative_error(const float* out, const float* ref, int64_t n) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);
}

// gtest parameter names: "goldens/llama" -> goldens_llama.
inline std::string case_label(const std::string& name) {
  std::string label = name;
  std::replace(label.begin(), label.end(), '/', '_');
  std::replace(label.begin(), label.end(), '-', '_');
  return label;
}

}  // namespace kettle::golden
