// Error vocabulary of the core. The bindings map each to one Python exception:
//   InvariantError        -> AssertionError  (a broken internal invariant)
//   std::invalid_argument -> ValueError      (a bad value from the caller)
//   std::out_of_range     -> IndexError      (an index outside its range)
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

namespace statecache {

class InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Throws std::invalid_argument naming the argument and its value.
[[noreturn]] void bad_argument(const char* name, long long value, const char* why);
[[noreturn]] void bad_argument(const char* name, const std::string& value, const char* why);
// Throws std::out_of_range naming the argument, its value and the valid range.
[[noreturn]] void out_of_range(const char* name, long long value, long long limit);

// Checks `0 <= value < limit` for an index argument.
inline void check_index(const char* name, long long value, long long limit) {
  if (value < 0 || value >= limit) out_of_range(name, value, limit);
}

inline void check_invariant(bool ok, const char* what) {
  if (!ok) throw InvariantError(what);
}

// For a loop whose steps call a pool that may throw (core/unit_provider.h):
// a step that throws does not stop the rest, so the loop still leaves its
// object consistent; the first exception is rethrown once all have run.
class FirstError {
 public:
  template <class Step>
  void run(Step&& step) {
    try {
      step();
    } catch (...) {
      if (!first_) first_ = std::current_exception();
    }
  }
  void rethrow() {
    if (first_) std::rethrow_exception(std::exchange(first_, nullptr));
  }

 private:
  std::exception_ptr first_;
};

}  // namespace statecache
