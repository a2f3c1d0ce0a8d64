// A writer of Python pickles (protocol 2) holding dicts, lists, strings,
// integers, floats, booleans, None and pairs: the subset that PyTorch's
// memory snapshot uses (torch/cuda/_memory_viz.py and the memory_viz viewer
// read snapshots with pickle.load). No C++ library for pickles is packaged
// for Debian, and writing this subset is short: each value is one opcode
// and its bytes (Python's Lib/pickletools.py documents every opcode used).
//
// Use: values are appended in order; a dict's contents are alternating
// keys and values between BeginDict and EndDict, a list's items between
// BeginList and EndList. Finish() adds STOP and returns the bytes.
// Strings must be UTF-8: invalid bytes are written as U+FFFD so that
// pickle.load never fails on a tag or a path.
//
// Thread safety: none (one writer per snapshot).
#ifndef VMMSHIM_CORE_REPORT_PICKLE_WRITER_H_
#define VMMSHIM_CORE_REPORT_PICKLE_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace vmmshim {

class PickleWriter {
 public:
  PickleWriter();

  void BeginDict();
  void EndDict();
  void BeginList();
  void EndList();

  void String(absl::string_view utf8);
  void Int(int64_t value);
  void UInt(uint64_t value);
  void Float(double value);
  void Bool(bool value);
  void None();
  // A tuple of two integers.
  void Pair(int64_t first, int64_t second);

  // A dict entry: the key, then the value written next.
  void Key(absl::string_view key) { String(key); }
  // A dict entry with its value.
  void IntEntry(absl::string_view key, int64_t value) {
    Key(key);
    Int(value);
  }
  void UIntEntry(absl::string_view key, uint64_t value) {
    Key(key);
    UInt(value);
  }
  void StringEntry(absl::string_view key, absl::string_view value) {
    Key(key);
    String(value);
  }
  void BoolEntry(absl::string_view key, bool value) {
    Key(key);
    Bool(value);
  }

  // The pickle, with STOP; the writer must not be used afterwards.
  std::string Finish();

 private:
  std::string out_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_REPORT_PICKLE_WRITER_H_
