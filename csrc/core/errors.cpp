#include "core/errors.h"

namespace statecache {

void bad_argument(const char* name, long long value, const char* why) {
  throw std::invalid_argument(std::string(name) + "=" + std::to_string(value) + ": " + why);
}

void bad_argument(const char* name, const std::string& value, const char* why) {
  throw std::invalid_argument(std::string(name) + "=" + value + ": " + why);
}

void out_of_range(const char* name, long long value, long long limit) {
  throw std::out_of_range(std::string(name) + "=" + std::to_string(value) + " is out of range [0, " +
                          std::to_string(limit) + ")");
}

}  // namespace statecache
