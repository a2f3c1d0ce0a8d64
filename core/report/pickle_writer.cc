#include "core/report/pickle_writer.h"

#include <cstring>

namespace vmmshim {
namespace {

// Opcodes (Lib/pickletools.py).
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kBinUnicode = 'X';
constexpr char kBinInt = 'J';    // 4-byte signed little-endian
constexpr char kBinInt1 = 'K';   // 1-byte unsigned
constexpr char kLong1 = '\x8a';  // n bytes, little-endian two's complement
constexpr char kBinFloat = 'G';  // 8-byte big-endian double
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kNone = 'N';
constexpr char kTuple2 = '\x86';

// Appends `s` with every byte sequence that is not UTF-8 replaced by U+FFFD.
void AppendValidUtf8(absl::string_view s, std::string* out) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
    if (ok && n > 1) {
      // Overlong forms and surrogates are not UTF-8 either.
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      if ((n == 2 && c < 0xc2) || (n == 3 && c == 0xe0 && c1 < 0xa0) ||
          (n == 3 && c == 0xed && c1 >= 0xa0) || (n == 4 && c == 0xf0 && c1 < 0x90) ||
          (n == 4 && (c > 0xf4 || (c == 0xf4 && c1 >= 0x90)))) {
        ok = false;
      }
    }
    if (ok) {
      out->append(s.data() + i, n);
      i += n;
    } else {
      out->append("\xef\xbf\xbd");
      ++i;
    }
  }
}

void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

PickleWriter::PickleWriter() {
  out_.push_back(kProto);
  out_.push_back('\x02');
}

void PickleWriter::BeginDict() {
  out_.push_back(kEmptyDict);
  out_.push_back(kMark);
}

void PickleWriter::EndDict() { out_.push_back(kSetItems); }

void PickleWriter::BeginList() {
  out_.push_back(kEmptyList);
  out_.push_back(kMark);
}

void PickleWriter::EndList() { out_.push_back(kAppends); }

void PickleWriter::String(absl::string_view utf8) {
  std::string valid;
  AppendValidUtf8(utf8, &valid);
  out_.push_back(kBinUnicode);
  AppendLittleEndian(valid.size(), 4, &out_);
  out_ += valid;
}

void PickleWriter::Int(int64_t value) {
  if (value >= 0 && value < 256) {
    out_.push_back(kBinInt1);
    out_.push_back(static_cast<char>(value));
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    out_.push_back(kBinInt);
    AppendLittleEndian(static_cast<uint32_t>(static_cast<int32_t>(value)), 4, &out_);
  } else {
    // Two's complement in the fewest bytes that keep the sign (at most 8).
    int bytes = 1;
    while (bytes < 8) {
      const int64_t low = -(int64_t{1} << (8 * bytes - 1));
      const int64_t high = (int64_t{1} << (8 * bytes - 1)) - 1;
      if (value >= low && value <= high) break;
      ++bytes;
    }
    out_.push_back(kLong1);
    out_.push_back(static_cast<char>(bytes));
    AppendLittleEndian(static_cast<uint64_t>(value), bytes, &out_);
  }
}

void PickleWriter::UInt(uint64_t value) {
  if (value <= static_cast<uint64_t>(INT64_MAX)) {
    Int(static_cast<int64_t>(value));
    return;
  }
  // Nine bytes: the eighth byte's top bit is set, so a zero byte keeps it positive.
  out_.push_back(kLong1);
  out_.push_back('\x09');
  AppendLittleEndian(value, 8, &out_);
  out_.push_back('\0');
}

void PickleWriter::Float(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  out_.push_back(kBinFloat);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void PickleWriter::Bool(bool value) { out_.push_back(value ? kNewTrue : kNewFalse); }

void PickleWriter::None() { out_.push_back(kNone); }

void PickleWriter::Pair(int64_t first, int64_t second) {
  Int(first);
  Int(second);
  out_.push_back(kTuple2);
}

std::string PickleWriter::Finish() {
  out_.push_back(kStop);
  return std::move(out_);
}

}  // namespace vmmshim
