// The one exception type for errors a user can cause (bad spec, bad option,
// bad file). Its message is a single line naming the bad value and what would
// be accepted; the command line prints it as "exmy: error: <message>".
#pragma once

#include <stdexcept>
#include <string>

namespace exmy {

struct Error : std::runtime_error {
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace exmy
