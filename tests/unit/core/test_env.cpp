// core/env.h: the table of DEEPINFER_* variables, the value checks, and the source tree against
// the table (every variable the code reads is declared; every declared one is read; the scripts
// and tests set only declared variables to valid values).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "core/env.h"
#include "core/error.h"

namespace di {
namespace {

namespace fs = std::filesystem;

// A variable of the table that nothing in this test binary reads otherwise.
constexpr const char* kProbe = "DEEPINFER_COMBINE_WARP";

struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    ::setenv(name.c_str(), value, 1);
  }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

TEST(Env, TableIsSortedUniqueAndWellFormed) {
  std::string_view previous;
  const std::regex item(R"(^(-?\d+\.\.(-?\d+)?|[A-Za-z0-9_.-]+)$)");
  for (const env::Variable& v : env::variables()) {
    EXPECT_TRUE(v.name.starts_with("DEEPINFER_")) << v.name;
    EXPECT_LT(previous, v.name) << "not sorted or repeated at " << v.name;
    previous = v.name;
    EXPECT_FALSE(v.help.empty()) << v.name;
    EXPECT_FALSE(v.unset.empty()) << v.name;
    std::string values(v.values);
    std::stringstream items(values);
    for (std::string it; std::getline(items, it, '|');)
      EXPECT_TRUE(std::regex_match(it, item)) << v.name << ": item '" << it << "'";
    EXPECT_EQ(env::find(v.name), &v);
  }
  EXPECT_EQ(env::find("DEEPINFER_NOT_A_SWITCH"), nullptr);
}

TEST(Env, ValuesAreLiteralsAndIntegerRanges) {
  const env::Variable* mask = env::find("DEEPINFER_PDL_DECODE");  // 0..15
  ASSERT_NE(mask, nullptr);
  EXPECT_FALSE(env::invalid(*mask, "0"));
  EXPECT_FALSE(env::invalid(*mask, "13"));
  EXPECT_FALSE(env::invalid(*mask, "15"));
  EXPECT_TRUE(env::invalid(*mask, "16"));
  EXPECT_TRUE(env::invalid(*mask, "-1"));
  EXPECT_TRUE(env::invalid(*mask, "1 "));
  EXPECT_TRUE(env::invalid(*mask, "0x3"));
  const env::Variable* split = env::find("DEEPINFER_ATTN_SPLIT");  // 0|16..
  ASSERT_NE(split, nullptr);
  EXPECT_FALSE(env::invalid(*split, "0"));
  EXPECT_FALSE(env::invalid(*split, "16"));
  EXPECT_FALSE(env::invalid(*split, "100000"));
  EXPECT_TRUE(env::invalid(*split, "8"));
  const env::Variable* mode = env::find("DEEPINFER_GQA_DECODE_MMA");  // -1|0|1
  ASSERT_NE(mode, nullptr);
  EXPECT_FALSE(env::invalid(*mode, "-1"));
  EXPECT_TRUE(env::invalid(*mode, "2"));
  const env::Variable* gu = env::find("DEEPINFER_MOE_T1_GU");  // 4x4|2x6|2x8
  ASSERT_NE(gu, nullptr);
  EXPECT_FALSE(env::invalid(*gu, "2x6"));
  EXPECT_TRUE(env::invalid(*gu, "2x7"));
  EXPECT_TRUE(env::invalid(*gu, "2X6"));
  const env::Variable* model = env::find("DEEPINFER_MODEL");  // any text
  ASSERT_NE(model, nullptr);
  EXPECT_FALSE(env::invalid(*model, "/some/where"));
  // The message names the variable, the value, what it takes and what it does.
  const auto why = env::invalid(*gu, "2x7");
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("DEEPINFER_MOE_T1_GU=2x7"), std::string::npos) << *why;
  EXPECT_NE(why->find("4x4|2x6|2x8"), std::string::npos) << *why;
  EXPECT_NE(why->find(gu->help), std::string::npos) << *why;
}

TEST(Env, GetReturnsValidValuesAndThrowsOnInvalidOrUndeclared) {
  ::unsetenv(kProbe);
  EXPECT_EQ(env::get(kProbe), nullptr);
  EXPECT_EQ(env::get_int(kProbe, 7), 7);
  {
    ScopedEnv e(kProbe, "1");
    ASSERT_NE(env::get(kProbe), nullptr);
    EXPECT_STREQ(env::get(kProbe), "1");
    EXPECT_EQ(env::get_int(kProbe, 7), 1);
  }
  {
    ScopedEnv e(kProbe, "");  // empty reads as unset
    EXPECT_EQ(env::get(kProbe), nullptr);
    EXPECT_EQ(env::get_int(kProbe, 7), 7);
  }
  {
    ScopedEnv e(kProbe, "yes");
    EXPECT_THROW(env::get(kProbe), Error);
    EXPECT_THROW(env::get_int(kProbe, 0), Error);
    try {
      env::get(kProbe);
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("DEEPINFER_COMBINE_WARP=yes: expected 0|1"),
                std::string::npos)
          << err.what();
    }
  }
  EXPECT_THROW(env::get("DEEPINFER_NOT_A_SWITCH"), Error);
  {
    ScopedEnv e("DEEPINFER_MOE_T1_GU", "2x6");  // valid, but not an integer
    EXPECT_THROW(env::get_int("DEEPINFER_MOE_T1_GU", 0), Error);
  }
}

TEST(Env, IsComparesWithADeclaredValueOnly) {
  ::unsetenv(kProbe);
  EXPECT_FALSE(env::is(kProbe, "1"));
  EXPECT_FALSE(env::is(kProbe, "0"));
  {
    ScopedEnv e(kProbe, "1");
    EXPECT_TRUE(env::is(kProbe, "1"));
    EXPECT_FALSE(env::is(kProbe, "0"));
    EXPECT_THROW(env::is(kProbe, "on"), Error);  // not one of 0|1: a site's typo
  }
  {
    ScopedEnv e("DEEPINFER_MOE_T1_GU", "2x6");
    EXPECT_TRUE(env::is("DEEPINFER_MOE_T1_GU", "2x6"));
    EXPECT_FALSE(env::is("DEEPINFER_MOE_T1_GU", "4x4"));
  }
  EXPECT_THROW(env::is("DEEPINFER_NOT_A_SWITCH", "1"), Error);
}

TEST(Env, CheckEnvironmentReportsInvalidValuesAndUnknownNames) {
  for (const env::Problem& p : env::check_environment())
    ADD_FAILURE() << "the test's own environment: " << p.message;
  {
    ScopedEnv typo("DEEPINFER_COMBINE_WARPP", "1");
    ScopedEnv bad("DEEPINFER_MOE_DECODE", "fast");
    ScopedEnv stranger("DEEPINFER_ZZZZZZZZZZZZZZZZZZ", "1");
    const auto problems = env::check_environment();
    ASSERT_EQ(problems.size(), 3u);
    int fatal = 0, suggested = 0, plain = 0;
    for (const env::Problem& p : problems) {
      if (p.fatal) {
        ++fatal;
        EXPECT_NE(p.message.find("DEEPINFER_MOE_DECODE=fast: expected v1|v2|tc"), std::string::npos)
            << p.message;
      } else if (p.message.find("did you mean DEEPINFER_COMBINE_WARP?") != std::string::npos) {
        ++suggested;
      } else {
        EXPECT_NE(p.message.find("DEEPINFER_ZZZZZZZZZZZZZZZZZZ is not a deepinfer variable"),
                  std::string::npos)
            << p.message;
        ++plain;
      }
    }
    EXPECT_EQ(fatal, 1);
    EXPECT_EQ(suggested, 1);
    EXPECT_EQ(plain, 1);
    const auto set = env::set_variables();
    EXPECT_NE(std::find(set.begin(), set.end(), "DEEPINFER_MOE_DECODE=fast"), set.end());
  }
  EXPECT_TRUE(env::check_environment().empty());
}

TEST(Env, ReportEnvironmentFailsOnInvalidValuesOnly) {
  EXPECT_TRUE(env::report_environment("test_env"));
  ScopedEnv typo("DEEPINFER_COMBINE_WARPP", "1");
  EXPECT_TRUE(env::report_environment("test_env"));  // a warning on stderr
  ScopedEnv bad(kProbe, "2");
  EXPECT_FALSE(env::report_environment("test_env"));
}

fs::path source_dir() {
  const char* d = std::getenv("DI_SOURCE_DIR");
  return d != nullptr ? fs::path(d) : fs::current_path();
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <typename F>
void for_each_file(const fs::path& root, const std::set<std::string>& exts, F&& f) {
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (exts.count(ext) != 0 || (exts.count("") != 0 && ext.empty())) f(e.path());
  }
}

// Every DEEPINFER_* string literal in src/ and bench/ names a variable of the table, none is read
// with std::getenv outside core/env.cpp, and every variable of the table is named somewhere.
TEST(Env, TheSourceReadsExactlyTheDeclaredVariables) {
  const fs::path root = source_dir();
  ASSERT_TRUE(fs::exists(root / "src/core/env.cpp")) << root;
  const std::regex literal(R"re("(DEEPINFER_[A-Z0-9_]+)")re");
  const std::regex direct(R"re(getenv\(\s*"DEEPINFER_)re");
  std::set<std::string> named;
  const std::set<std::string> code = {".cpp", ".h", ".cu", ".cuh"};
  for (const char* dir : {"src", "bench", "tests"}) {
    for_each_file(root / dir, code, [&](const fs::path& p) {
      const std::string text = read_file(p);
      const std::string rel = fs::relative(p, root).string();
      if (rel == "src/core/env.cpp" || rel == "tests/unit/core/test_env.cpp") return;
      for (std::sregex_iterator it(text.begin(), text.end(), literal), end; it != end; ++it) {
        const std::string name = (*it)[1];
        named.insert(name);
        EXPECT_NE(env::find(name), nullptr)
            << rel << " names " << name << ", which core/env.cpp does not declare";
      }
      if (std::string(dir) == "src") {
        EXPECT_FALSE(std::regex_search(text, direct))
            << rel << " reads a DEEPINFER_ variable with getenv instead of env::get";
      }
    });
  }
  // Every env::is(name, value) in src compares with a declared literal (is() would throw when
  // the line runs; this finds it without running it). Sites that name the variable once as
  // kName compare against the nearest kName = "DEEPINFER_..." above them.
  const std::regex is_call(R"re(env::is\(\s*("(DEEPINFER_[A-Z0-9_]+)"|kName),\s*"([^"]*)"\))re");
  const std::regex kname(R"re(kName = "(DEEPINFER_[A-Z0-9_]+)")re");
  int is_calls = 0;
  for_each_file(root / "src", code, [&](const fs::path& p) {
    const std::string text = read_file(p);
    const std::string rel = fs::relative(p, root).string();
    for (std::sregex_iterator it(text.begin(), text.end(), is_call), end; it != end; ++it) {
      std::string name = (*it)[2];
      if (name.empty()) {  // kName: the last definition before this call
        const std::string before = text.substr(0, static_cast<size_t>(it->position()));
        for (std::sregex_iterator k(before.begin(), before.end(), kname); k != end; ++k)
          name = (*k)[1];
      }
      const env::Variable* v = env::find(name);
      ASSERT_NE(v, nullptr) << rel << ": env::is on '" << name << "'";
      const std::string value = (*it)[3];
      EXPECT_FALSE(env::invalid(*v, value)) << rel << ": env::is(" << name << ", \"" << value
                                            << "\") compares with an undeclared value";
      ++is_calls;
    }
  });
  EXPECT_GT(is_calls, 20);

  // What the scripts and the e2e harness read or set (DEEPINFER_BIN) counts as named too.
  const std::regex mention(R"re(\b(DEEPINFER_[A-Z0-9_]+))re");
  for (const char* dir : {"scripts", "tests/e2e"}) {
    for_each_file(root / dir, {".sh", ".py", ".mjs", ".js", ".txt", ""}, [&](const fs::path& p) {
      const std::string text = read_file(p);
      for (std::sregex_iterator it(text.begin(), text.end(), mention), end; it != end; ++it)
        named.insert((*it)[1]);
    });
  }
  for (const env::Variable& v : env::variables())
    EXPECT_EQ(named.count(std::string(v.name)), 1u)
        << v.name << " is declared in core/env.cpp but nothing reads or sets it";
}

// Every DEEPINFER_X=value the scripts, tests and benchmarks write (shell lines, ctest
// environments, setenv calls) names a declared variable and a valid value.
TEST(Env, ScriptsAndTestsSetOnlyValidValues) {
  const fs::path root = source_dir();
  const std::regex assignment(R"re(\b(DEEPINFER_[A-Z0-9_]+)=([A-Za-z0-9_./-]*))re");
  const std::regex set_call(R"re(setenv\(\s*"(DEEPINFER_[A-Z0-9_]+)",\s*"([^"]*)")re");
  int checked = 0;
  auto check = [&](const std::string& where, const std::string& name, const std::string& value) {
    const env::Variable* v = env::find(name);
    if (name.find("NOT_A_SWITCH") != std::string::npos) return;  // this test's own probe names
    ASSERT_NE(v, nullptr) << where << " sets " << name << ", which core/env.cpp does not declare";
    if (!value.empty() && value[0] != '$') {
      const auto why = env::invalid(*v, value);
      EXPECT_FALSE(why) << where << ": " << *why;
      ++checked;
    }
  };
  const std::set<std::string> exts = {".sh", ".py",  ".txt", ".cmake", ".cpp",
                                      ".h",  ".mjs", ".js",  ""};
  for (const char* dir : {"scripts", "tests", "bench"}) {
    for_each_file(root / dir, exts, [&](const fs::path& p) {
      const std::string rel = fs::relative(p, root).string();
      // The two tests of invalid values set them on purpose.
      if (rel == "tests/unit/core/test_env.cpp" || rel == "tests/e2e/cli_startup.test.mjs" ||
          rel.starts_with("tests/fixtures"))
        return;
      const std::string text = read_file(p);
      for (std::sregex_iterator it(text.begin(), text.end(), assignment), end; it != end; ++it)
        check(rel, (*it)[1], (*it)[2]);
      for (std::sregex_iterator it(text.begin(), text.end(), set_call), end; it != end; ++it)
        check(rel, (*it)[1], (*it)[2]);
    });
  }
  EXPECT_GT(checked, 10) << "the scan found almost no assignments: is DI_SOURCE_DIR right?";
}

}  // namespace
}  // namespace di
