// check.h: HGRN_CHECK, the one way hgrn reports a violated precondition: an hgrn::Error naming what was expected.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace hgrn {

// Every user-facing failure (bad config, bad tensor shape, bad data) is an Error; the CLI prints what() and exits non-zero.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace hgrn

#define HGRN_CHECK(cond, ...)                                                                   \
  do {                                                                                          \
    if (!(cond))                                                                                \
      throw ::hgrn::Error(::hgrn::detail::concat(__VA_ARGS__, " [", __FILE__, ":", __LINE__, "]")); \
  } while (0)
