#include "core/error.h"

namespace di {

void throw_check_failure(const char* expr, const std::string& message,
                         const std::source_location& where) {
  std::string file = where.file_name();
  if (auto pos = file.rfind("/src/"); pos != std::string::npos) file = file.substr(pos + 1);
  if (expr[0] == '\0') throw Error(fmt::format("{} ({}:{})", message, file, where.line()));
  throw Error(fmt::format("{} [check `{}` failed at {}:{}]", message, expr, file, where.line()));
}

}  // namespace di
