// safetensors parsing: dtypes, shapes and offsets read in place; malformed
// files rejected with errors naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/safetensors.h"
#include "model/weight_store.h"
#include "util/error.h"

namespace kettle {
namespace {

namespace fs = std::filesystem;

fs::path write_file(const std::string& name, const std::string& header, const std::string& data) {
  fs::path p = fs::temp_directory_path() / ("kettle_st_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream out(p, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
  return p;
}

TEST(Safetensors, ReadsTensorsInPlace) {
  float values[3] = {1.5f, -2.0f, 3.25f};
  std::string data(reinterpret_cast<const char*>(values), sizeof values);
  data += std::string("\x80\x3f\x00\x40", 4);  // bf16 1.0, 2.0
  auto p = write_file("ok", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                            R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[12,16]},"__metadata__":{"format":"pt"}})",
                      data);
  SafetensorsFile f(p.string());
  ASSERT_EQ(f.entries().size(), 2u);
  const Tensor& a = f.entries().at("a").tensor;
  EXPECT_EQ(a.dtype, DType::kF32);
  EXPECT_EQ(a.shape, std::vector<int64_t>({3}));
  EXPECT_FLOAT_EQ(static_cast<const float*>(a.data)[2], 3.25f);
  const Tensor& b = f.entries().at("b").tensor;
  EXPECT_EQ(b.dtype, DType::kBF16);
  EXPECT_FLOAT_EQ(bf16_to_f32(static_cast<const uint16_t*>(b.data)[1]), 2.0f);
  fs::remove(p);
}

void expect_invalid(const std::string& name, const std::string& header, const std::string& data, const std::string& needle) {
  auto p = write_file(name, header, data);
  try {
    SafetensorsFile f(p.string());
    ADD_FAILURE() << "accepted a bad file: " << name;
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidData);
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  fs::remove(p);
}

TEST(Safetensors, RejectsMalformedFiles) {
  expect_invalid("past_end", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0'), "'w'");
  expect_invalid("size_mismatch", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'), "'w'");
  expect_invalid("not_json", "{nope", "", "header");
  expect_invalid("bad_entry", R"({"w":{"dtype":"F32"}})", "", "'w'");
  expect_invalid("bad_dtype", R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", "x", "Q7");
  expect_invalid("reversed", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", "x", "'w'");
}

TEST(Safetensors, NonFloatTensorsAreRefusedOnlyWhenUsed) {
  auto dir = fs::temp_directory_path() / ("kettle_store_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string data(16, '\0');
  auto p = write_file("store", R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                               R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                      data);
  fs::rename(p, dir / "model.safetensors");
  WeightStore store = WeightStore::open_folder(dir.string());
  EXPECT_TRUE(store.contains("w"));
  EXPECT_EQ(store.get("w", {2}).dtype, DType::kF32);
  EXPECT_THROW(store.get("ids"), Error);
  EXPECT_THROW(store.get("w", {3}), Error);
  EXPECT_THROW(store.get("absent"), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kettle
