#include "recipe/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace di::recipe {
namespace {

// Unicode White_Space, which is Oniguruma's (and Rust's) `\s`.
constexpr std::string_view kWhiteSpaceMembers =
    "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// Per-thread matching state: PCRE2 match data and a JIT stack large enough for long whitespace runs
// (`\s+(?!\S)` backtracks over the whole run).
struct ThreadState {
  pcre2_match_data* match_data = pcre2_match_data_create(8, nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadState() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~ThreadState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(match_data);
  }
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

std::string translate_onig_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      if (e == 's') {
        if (in_class) {
          out.append(kWhiteSpaceMembers);
        } else {
          out.append("[").append(kWhiteSpaceMembers).append("]");
        }
      } else if (e == 'S' && !in_class) {
        out.append("[^").append(kWhiteSpaceMembers).append("]");
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:alpha:]
      size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

Result<Regex> Regex::compile(std::string_view pattern, bool literal) {
  std::string translated = literal ? std::string(pattern) : translate_onig_pattern(pattern);
  uint32_t options = PCRE2_UTF | PCRE2_NO_UTF_CHECK | PCRE2_USE_OFFSET_LIMIT;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP;  // PCRE2_LITERAL rejects PCRE2_UCP
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   options, &error, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return make_status(StatusCode::kInvalidArgument, "cannot compile regex {:?} at offset {}: {}",
                       std::string(pattern), error_offset, reinterpret_cast<const char*>(message));
  }
  Regex re;
  auto holder = std::make_shared<Code>();
  holder->code = code;
  int jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  if (jit != 0) {
    return make_status(StatusCode::kUnavailable, "PCRE2 JIT is unavailable for regex {:?} (error {})",
                       std::string(pattern), jit);
  }
  re.code_ = std::move(holder);
  re.pattern_ = std::string(pattern);
  return re;
}

bool Regex::find(std::string_view subject, size_t start, size_t* match_begin, size_t* match_end,
                 size_t max_start) const {
  ThreadState& ts = thread_state();
  pcre2_set_offset_limit(ts.context, max_start == std::string_view::npos ? PCRE2_UNSET : max_start);
  int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start,
                       PCRE2_NO_UTF_CHECK, ts.match_data, ts.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  DI_CHECK(rc >= 0, "regex {:?} failed with PCRE2 error {} on {} bytes", pattern_, rc, subject.size());
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ts.match_data);
  *match_begin = ov[0];
  *match_end = ov[1];
  return true;
}

}  // namespace di::recipe
