// How a caller writes its 64-bit hashes as integers (docs/contract.md,
// "Words", "Divergences").
//
// Engines hash signed ([-2**63, 2**63)) or unsigned ([0, 2**64)); the library
// keys everything by the 64-bit pattern, so -5 and 2**64 - 5 are one hash
// here. A pattern with its top bit set reads back in the form its object was
// given: each object that takes hashes (a pool, a store, a block pool, an
// offload index, a Sequence) takes the form of the first such hash it is
// given, and refuses the other form afterwards. -1 (all bits set) is "no
// hash" in either form and decides nothing; its unsigned spelling 2**64 - 1
// is refused where the argument is converted.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace statecache {

class HashForm {
 public:
  enum Kind : uint8_t { kUnset = 0, kSigned = 1, kUnsigned = 2 };

  Kind kind() const { return kind_; }
  bool is_unsigned() const { return kind_ == kUnsigned; }

  // Whether a pattern takes a form at all: the top bit set, and not -1.
  static bool has_form(int64_t bits) { return bits < -1; }

  // Whether `given` (the form a hash with its top bit set came in) agrees
  // with the forms seen so far.
  bool accepts(Kind given) const { return kind_ == kUnset || given == kUnset || kind_ == given; }

  // Records the form of hash `bits` given as `given` for argument `name`;
  // std::invalid_argument naming it when this object was given the other
  // form before (nothing recorded then).
  void note(const char* name, int64_t bits, Kind given) {
    if (!has_form(bits) || given == kUnset) return;
    if (!accepts(given)) throw std::invalid_argument(conflict(name, bits, given));
    kind_ = given;
  }

  // The message for `bits` given in form `given` to an object of the other form.
  static std::string conflict(const char* name, int64_t bits, Kind given) {
    const std::string as_signed = std::to_string(bits);
    const std::string as_unsigned = std::to_string(static_cast<uint64_t>(bits));
    if (given == kUnsigned)
      return std::string(name) + "=" + as_unsigned +
             " is an unsigned hash, but this object was given signed hashes (the same bits are " + as_signed +
             "); give one object its hashes in one form";
    return std::string(name) + "=" + as_signed + " is a negative hash, but this object was given unsigned hashes " +
           "(the same bits are " + as_unsigned + "); give one object its hashes in one form";
  }

 private:
  Kind kind_ = kUnset;
};

}  // namespace statecache
