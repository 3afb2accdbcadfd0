#pragma once
// The DEEPINFER_* environment variables. Each one is declared once, in env.cpp's table, with the
// values it takes, what leaving it unset means and what it does; code reads them through
// env::get, never through std::getenv:
//
//   static const bool on = di::env::get_int("DEEPINFER_PDL", 1) != 0;
//
// A value outside a variable's declared set is an error where it is read (and at the start of
// every `deepinfer` command, check_environment), not a silent fall back to the default; a set
// DEEPINFER_* variable that the table does not name is reported as a warning (a misspelt
// switch would otherwise measure the default twice). `deepinfer env` prints the table.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace di::env {

struct Variable {
  std::string_view name;    // DEEPINFER_...
  std::string_view values;  // '|'-separated literals and integer ranges "a..b" / "a.."; "" any text
  std::string_view unset;   // what leaving it unset (or empty) means
  std::string_view help;    // what it does
};

// The table, sorted by name (a range over it: nvcc compiles this header as C++17, no std::span).
struct Variables {
  const Variable* first;
  const Variable* last;
  const Variable* begin() const { return first; }
  const Variable* end() const { return last; }
  size_t size() const { return static_cast<size_t>(last - first); }
};
Variables variables();
const Variable* find(std::string_view name);

// Why `value` is not one of v's values (a message naming the variable); nullopt when it is.
std::optional<std::string> invalid(const Variable& v, std::string_view value);

// The variable's value; nullptr when it is unset or empty. Throws di::Error when `name` is not
// in the table (a programming error) or when its value is invalid.
const char* get(const char* name);

// Whether the variable is set to `value`, which must be one of its declared literals (throws
// di::Error otherwise, so a site cannot test for a value the table does not offer):
//   static const bool serial = env::is("DEEPINFER_MOE_ROUTE", "serial");
bool is(const char* name, const char* value);

// get(name) as an integer; `unset` when it is not set. Throws di::Error as get does, and when
// the value is not an integer.
int get_int(const char* name, int unset);

struct Problem {
  bool fatal = false;  // an invalid value; otherwise a name the table does not have
  std::string message;
};
// Every DEEPINFER_* variable of the process environment, checked against the table.
std::vector<Problem> check_environment();

// check_environment() written to stderr, a line each ("<program>: warning: ..." / "error: ...");
// false when a value is invalid. For the benchmark binaries, whose A/B runs set these switches:
// a misspelt name would otherwise measure the default under the wrong label.
bool report_environment(const char* program);

// The variables of the process environment that the table names, as NAME=value.
std::vector<std::string> set_variables();

}  // namespace di::env
