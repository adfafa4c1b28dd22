// `kettle tokenize`: encode text (or decode ids) with a model's tokenizer.json;
// --lines handles a whole corpus in one process, --bench measures single-thread
// encode throughput.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/options.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/timer.h"

namespace kettle::cli {
namespace {

struct TokenizeFlags {
  std::string tokenizer;
  std::string text;
  std::string file;
  std::string decode;
  std::string decode_file;
  bool lines = false;
  bool no_special = false;
  bool skip_special = false;
  bool json = false;
  bool bench = false;
  CLI::Option* text_opt = nullptr;
};

std::string read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCategory::kNotFound, "{} {}: cannot open", flag, path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Lines without their '\n'; a final newline does not start another line.
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string join_ids(const std::vector<int32_t>& ids) {
  return fmt::format("{}", fmt::join(ids, ","));
}

int run_bench(const Tokenizer& tok, const std::vector<std::string_view>& docs, const TokenizeFlags& f) {
  size_t bytes = 0;
  for (auto d : docs) bytes += d.size();
  size_t tokens = 0;
  for (auto d : docs) tokens += tok.encode(d, !f.no_special).size();  // warm-up pass fills the word cache
  int passes = 0;
  Timer timer;
  do {
    for (auto d : docs) tok.encode(d, !f.no_special);
    ++passes;
  } while (timer.seconds() < 1.0);
  const double secs = timer.seconds() / passes;
  const double mbps = bytes / secs / 1e6;
  if (f.json) {
    std::printf("%s\n", dump({{"bytes", bytes},
                              {"documents", docs.size()},
                              {"tokens", tokens},
                              {"passes", passes},
                              {"seconds_per_pass", secs},
                              {"mb_per_second", mbps}})
                            .c_str());
  } else {
    std::printf("%zu bytes, %zu documents, %zu tokens: %.2f ms per pass, %.2f MB/s (1 thread)\n", bytes, docs.size(),
                tokens, secs * 1e3, mbps);
  }
  return 0;
}

int run_tokenize(const TokenizeFlags& f) {
  const Tokenizer tok = Tokenizer::from_file(f.tokenizer);
  if (!f.decode.empty() || !f.decode_file.empty()) {
    std::vector<std::string> lists;
    if (!f.decode.empty()) lists.push_back(f.decode);
    if (!f.decode_file.empty()) {
      const std::string content = read_file(f.decode_file, "--decode-file");
      for (auto line : split_lines(content)) lists.emplace_back(line);
    }
    for (const std::string& list : lists) {
      const std::vector<int32_t> ids = list.find_first_not_of(" \t\r") == std::string::npos
                                           ? std::vector<int32_t>{}
                                           : parse_id_list(list, "--decode");
      const std::string text = tok.decode(ids, f.skip_special);
      if (f.json)
        std::printf("%s\n", dump(text).c_str());
      else
        std::printf("%s\n", text.c_str());
    }
    return 0;
  }

  std::string input;
  if (f.text_opt->count())
    input = f.text;
  else if (!f.file.empty())
    input = read_file(f.file, "--file");
  else
    fail(ErrorCategory::kInvalidArgument, "tokenize: give --text, --file, --decode or --decode-file");

  std::vector<std::string_view> docs;
  if (f.lines)
    docs = split_lines(input);
  else
    docs.push_back(input);
  if (f.bench) return run_bench(tok, docs, f);

  for (std::string_view doc : docs) {
    const std::vector<int32_t> ids = tok.encode(doc, !f.no_special);
    if (f.lines) {
      std::printf("%s\n", f.json ? dump(ids).c_str() : join_ids(ids).c_str());
      continue;
    }
    std::vector<std::string> tokens;
    for (int32_t id : ids) tokens.push_back(tok.id_to_token(id));
    if (f.json) {
      std::printf("%s\n", dump({{"ids", ids}, {"tokens", tokens}}).c_str());
    } else {
      std::printf("%s\n", join_ids(ids).c_str());
      std::string shown;
      for (const std::string& t : tokens) shown += (shown.empty() ? "" : " ") + dump(t);
      std::printf("%s\n", shown.c_str());
    }
  }
  return 0;
}

}  // namespace

Action register_tokenize(CLI::App& app) {
  auto f = std::make_shared<TokenizeFlags>();
  app.add_option("--tokenizer", f->tokenizer, "tokenizer.json, or a model folder containing one")->required();
  f->text_opt = app.add_option("--text", f->text, "text to encode");
  auto* file = app.add_option("--file", f->file, "file whose bytes to encode");
  f->text_opt->excludes(file);
  app.add_flag("--lines", f->lines,
               "encode each line of the input separately (without its newline), one output line each");
  app.add_option("--decode", f->decode, "decode these comma-separated ids instead of encoding");
  app.add_option("--decode-file", f->decode_file,
                 "decode every line of this file (comma-separated ids), one output line each");
  app.add_flag("--no-special", f->no_special,
               "do not add the post-processor's special tokens (add_special_tokens=false)");
  app.add_flag("--skip-special", f->skip_special, "decode: leave special tokens out");
  app.add_flag("--json", f->json,
               "JSON output: an id array per line with --lines, else {ids, tokens}; decoded text as a JSON string");
  app.add_flag("--bench", f->bench, "time single-thread encoding of the input and print MB/s");
  return [f] { return run_tokenize(*f); };
}

}  // namespace kettle::cli
