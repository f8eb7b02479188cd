// Protocol 3's program as Java hands it to the native layer: no text to parse, three typed arrays read front to
// back (integers: counts, integers, flags and argument kinds; doubles; strings), in the order that
// java/src/main/java/dev/gradbridge/ProgramArrays.java writes them and documents (the one description of the
// encoding). Java read the file with Gson and checked every field first (ProgramCheck, Schedules); this reader
// still checks each read against its array's end, each count against what is left and each flag for 0 or 1:
// arrays Java did not write are one line through the guard, never a read past an array's end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gradbridge::exported {

class ProgramArrays {
 public:
  ProgramArrays(std::vector<int64_t> integers, std::vector<double> doubles, std::vector<std::string> strings)
      : integers_(std::move(integers)), doubles_(std::move(doubles)), strings_(std::move(strings)) {}

  int64_t integer(const char* what) { return integers_[next(integer_, integers_.size(), "integers", what)]; }
  double number(const char* what) { return doubles_[next(double_, doubles_.size(), "doubles", what)]; }
  const std::string& text(const char* what) { return strings_[next(string_, strings_.size(), "strings", what)]; }

  bool flag(const char* what) {
    const int64_t value = integer(what);
    if (value != 0 && value != 1) fail(what, "is " + std::to_string(value) + ", expected 0 or 1");
    return value == 1;
  }

  // A list's length. Each item reads at least one value, so a count past the values left is refused before
  // any item is read (a loop never runs on for a count Java did not write).
  size_t count(const char* what) {
    const int64_t n = integer(what);
    const size_t left = (integers_.size() - integer_) + (doubles_.size() - double_) + (strings_.size() - string_);
    if (n < 0 || static_cast<uint64_t>(n) > left)
      fail(what, "counts " + std::to_string(n) + " items, " + std::to_string(left) + " values are left");
    return static_cast<size_t>(n);
  }

  // Every value read: what is left over was not written for this reader.
  void finish() const {
    if (integer_ != integers_.size() || double_ != doubles_.size() || string_ != strings_.size())
      throw std::invalid_argument("program arrays: " + std::to_string(integers_.size() - integer_) + " integers, " +
                                  std::to_string(doubles_.size() - double_) + " doubles and " +
                                  std::to_string(strings_.size() - string_) + " strings left unread");
  }

 private:
  [[noreturn]] static void fail(const char* what, const std::string& why) {
    throw std::invalid_argument(std::string("program arrays: ") + what + " " + why);
  }

  static size_t next(size_t& at, size_t size, const char* array, const char* what) {
    if (at >= size) fail(what, std::string("lies past the end of the ") + array + " (" + std::to_string(size) + ")");
    return at++;
  }

  std::vector<int64_t> integers_;
  std::vector<double> doubles_;
  std::vector<std::string> strings_;
  size_t integer_ = 0, double_ = 0, string_ = 0;
};

}  // namespace gradbridge::exported
