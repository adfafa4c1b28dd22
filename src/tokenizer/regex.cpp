// PCRE2 wrapper: compiles with UTF + UCP + JIT, rewrites \s so that it covers
// U+0085 as Oniguruma's does, and keeps per-thread match data so concurrent
// encodes share one compiled pattern.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "util/error.h"

namespace kettle {
namespace {

// Oniguruma's Unicode \s is the White_Space property, which includes NEL
// (U+0085); PCRE2's UCP \s does not. Rewrite \s / \S outside and \s inside
// character classes so both engines agree.
std::string onig_compatible(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        out += class_depth > 0 ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (n == 'S' && class_depth == 0) {
        out += "[^\\s\\x{85}]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[') {
      // "[:alpha:]" style POSIX classes nest inside a class without opening one.
      if (class_depth > 0 && i + 1 < p.size() && p[i + 1] == ':') {
        const size_t close = p.find(":]", i + 2);
        if (close != std::string::npos) {
          out.append(p, i, close + 2 - i);
          i = close + 1;
          continue;
        }
      }
      out += c;
      ++class_depth;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    // Long whitespace runs backtrack deeply under "\s+(?!\S)"; 32 KiB is not enough.
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

Regex::Regex(const std::string& pattern, bool literal) : pattern_(pattern) {
  const std::string compiled = literal ? pattern : onig_compatible(pattern);
  uint32_t options = PCRE2_UTF | PCRE2_NO_UTF_CHECK;
  if (literal)
    options |= PCRE2_LITERAL;
  else
    options |= PCRE2_UCP;
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), options, &err,
                                   &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail(ErrorCategory::kUnsupported, "regex /{}/ does not compile at offset {}: {}", pattern, err_offset,
         reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
  code_ = code;
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Regex::Regex(Regex&& other) noexcept : pattern_(std::move(other.pattern_)), code_(other.code_) {
  other.code_ = nullptr;
}

Regex& Regex::operator=(Regex&& other) noexcept {
  if (this != &other) {
    if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
    pattern_ = std::move(other.pattern_);
    code_ = other.code_;
    other.code_ = nullptr;
  }
  return *this;
}

bool Regex::next_match(std::string_view text, size_t from, size_t& start, size_t& end) const {
  if (from > text.size()) return false;
  MatchScratch& s = scratch();
  const int rc = pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             from, PCRE2_NO_UTF_CHECK, s.data, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    fail(ErrorCategory::kInternal, "regex /{}/ failed on a {}-byte input: {}", pattern_, text.size(),
         reinterpret_cast<const char*>(msg));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
  start = ov[0];
  end = ov[1];
  return true;
}

}  // namespace kettle
