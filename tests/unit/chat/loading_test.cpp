// ChatTemplate::from_path: tokenizer_config.json (string or named list,
// AddedToken special tokens), the chat_template.jinja fallback, template
// selection, and errors that name the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "chat/chat_template.h"
#include "util/error.h"

namespace kettle {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

class ChatLoading : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kettle_chat_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }

  fs::path dir_;
};

const Json kUser = Json::parse(R"([{"role": "user", "content": "hi"}])");

TEST_F(ChatLoading, StringTemplateAndAddedTokenSpecialTokens) {
  write("tokenizer_config.json",
        R"({"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ messages[0].content }}",
    "bos_token": {"__type": "AddedToken", "content": "<B>"}, "eos_token": "</E>", "unk_token": null})");
  const ChatTemplate t = ChatTemplate::from_path(dir_.string());
  EXPECT_EQ(t.render(kUser, nullptr, false), "<B>|</E>|false|hi");
  // The tokenizer_config.json path itself works too.
  EXPECT_EQ(ChatTemplate::from_path((dir_ / "tokenizer_config.json").string()).render(kUser, nullptr, false),
            "<B>|</E>|false|hi");
}

TEST_F(ChatLoading, NamedTemplatesPickDefaultToolUseOrTheRequestedName) {
  write("tokenizer_config.json", R"({"chat_template": [
    {"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}, {"name": "rag", "template": "R"}]})");
  const ChatTemplate t = ChatTemplate::from_path(dir_.string());
  EXPECT_EQ(t.render(kUser, nullptr, false), "D");
  EXPECT_EQ(t.render(kUser, Json::array(), false), "T");
  EXPECT_EQ(ChatTemplate::from_path(dir_.string(), "rag").render(kUser, Json::array(), false), "R");
  try {
    ChatTemplate::from_path(dir_.string(), "missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
  }
}

TEST_F(ChatLoading, FallsBackToChatTemplateJinja) {
  write("tokenizer_config.json", R"({"eos_token": "<eos>"})");
  write("chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}\n");
  EXPECT_EQ(ChatTemplate::from_path(dir_.string()).render(kUser, nullptr, false), "hi<eos>");
}

TEST_F(ChatLoading, ErrorsNameTheFile) {
  try {
    ChatTemplate::from_path((dir_ / "nope").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kNotFound);
  }
  write("tokenizer_config.json", "{not json");
  try {
    ChatTemplate::from_path(dir_.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidData);
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
  }
  write("tokenizer_config.json", R"({"chat_template": "ok\n{{ broken ( }}"})");
  try {
    ChatTemplate::from_path(dir_.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidData);
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  write("tokenizer_config.json", "{}");
  try {
    ChatTemplate::from_path(dir_.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kNotFound);
    EXPECT_NE(std::string(e.what()).find("chat_template.jinja"), std::string::npos) << e.what();
  }
}

TEST_F(ChatLoading, ShippedTemplatesCompile) {
  for (const char* name : {"phi3-format.jinja", "mistral-v3-format.jinja"}) {
    std::ifstream in(fs::path(KETTLE_TEST_DATA) / "chat_templates" / name);
    ASSERT_TRUE(in) << name;
    const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NO_THROW(ChatTemplate::from_source(source, Json{{"bos_token", "<s>"}, {"eos_token", "</s>"}})) << name;
  }
}

}  // namespace
}  // namespace kettle
