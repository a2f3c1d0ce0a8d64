// Which allocations a pause or resume takes, by allocation tag
// (docs/pause-resume.md): every one, the ones of one tag, or every one but
// those of some tags (an RL trainer keeps its weights and puts everything
// else to sleep). "" names the untagged allocations.
//
// A plain value: copy freely, no locking. Tags are at most 255 bytes each
// (the caller checks; vmmshim_set_allocation_tag's limit).
#ifndef VMMSHIM_CORE_HEAP_TAG_SELECTION_H_
#define VMMSHIM_CORE_HEAP_TAG_SELECTION_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace vmmshim {

class TagSelection {
 public:
  // Every allocation (the C API's NULL tag).
  static TagSelection All() { return TagSelection(Kind::kAll, {}); }
  // The allocations made under `tag`.
  static TagSelection Only(std::string tag) {
    return TagSelection(Kind::kOnly, {std::move(tag)});
  }
  // Every allocation whose tag is not one of `keep` (an empty `keep`: All).
  static TagSelection AllExcept(std::vector<std::string> keep) {
    return TagSelection(Kind::kAllExcept, std::move(keep));
  }
  // The optional-tag form the older interfaces use: nullptr is All.
  static TagSelection FromNullable(const char* tag) {
    return tag == nullptr ? All() : Only(tag);
  }

  bool Matches(absl::string_view tag) const {
    switch (kind_) {
      case Kind::kAll:
        return true;
      case Kind::kOnly:
        return tags_[0] == tag;
      case Kind::kAllExcept:
        for (const std::string& t : tags_) {
          if (t == tag) return false;
        }
        return true;
    }
    return false;
  }

  // Whether it takes every allocation.
  bool all() const { return kind_ == Kind::kAll || (kind_ == Kind::kAllExcept && tags_.empty()); }

  // For log lines: "tag 'kv'", "every allocation", "every allocation but tags 'w', ''".
  std::string Describe() const;

 private:
  enum class Kind { kAll, kOnly, kAllExcept };
  TagSelection(Kind kind, std::vector<std::string> tags)
      : kind_(kind), tags_(std::move(tags)) {}

  Kind kind_;
  std::vector<std::string> tags_;
};

}  // namespace vmmshim

#endif  // VMMSHIM_CORE_HEAP_TAG_SELECTION_H_
