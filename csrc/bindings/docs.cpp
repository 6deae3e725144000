#include "bindings/docs.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "statecache_api_docs.h"  // generated from docs/api.md by cmake/embed_docs.py

namespace statecache::bindings {

namespace py = pybind11;

namespace {

using api_docs::Entry;
using api_docs::kEntries;

constexpr bool sorted_once() {
  for (size_t i = 1; i < std::size(kEntries); ++i)
    if (!(std::string_view(kEntries[i - 1].name) < std::string_view(kEntries[i].name))) return false;
  return true;
}
static_assert(sorted_once(), "embed_docs.py writes the entries sorted, each name once");

std::vector<bool>& asked() {
  static std::vector<bool> flags(std::size(kEntries));
  return flags;
}

// "_SpanPlanner", "_debug_state": not "__init__".
bool is_private(std::string_view qualname) {
  size_t start = 0;
  for (;;) {
    const size_t dot = qualname.find('.', start);
    const std::string_view part = qualname.substr(start, dot == std::string_view::npos ? dot : dot - start);
    if (part.size() > 1 && part[0] == '_' && !(part.starts_with("__") && part.ends_with("__"))) return true;
    if (dot == std::string_view::npos) return false;
    start = dot + 1;
  }
}

}  // namespace

const char* doc(std::string_view qualname) {
  const Entry* end = std::end(kEntries);
  const Entry* it = std::lower_bound(std::begin(kEntries), end, qualname, [](const Entry& e, std::string_view key) {
    return std::string_view(e.name) < key;
  });
  if (it != end && std::string_view(it->name) == qualname) {
    asked()[static_cast<size_t>(it - std::begin(kEntries))] = true;
    return it->text;
  }
  if (is_private(qualname)) return nullptr;
  throw std::logic_error("docs/api.md has no entry for " + std::string(qualname) +
                         " (a public name needs one; a heading without text leaves it undocumented)");
}

const char* doc(py::handle cls, std::string_view member) {
  std::string qualname = py::cast<std::string>(cls.attr("__name__"));
  qualname += '.';
  qualname += member;
  return doc(qualname);
}

void check_docs_used(py::module_& m) {
  std::string unused;
  for (size_t i = 0; i < std::size(kEntries); ++i) {
    if (asked()[i]) continue;
    const std::string name = kEntries[i].name;
    if (!py::hasattr(m, name.substr(0, name.find('.')).c_str())) continue;  // not in this build
    unused += (unused.empty() ? "" : ", ") + name;
  }
  if (!unused.empty())
    throw std::logic_error("docs/api.md has entries no binding asks for (renamed or removed?): " + unused);
}

}  // namespace statecache::bindings
