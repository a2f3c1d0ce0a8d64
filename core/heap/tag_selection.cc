#include "core/heap/tag_selection.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vmmshim {

std::string TagSelection::Describe() const {
  auto quoted = [](std::string* out, const std::string& t) { absl::StrAppend(out, "'", t, "'"); };
  switch (kind_) {
    case Kind::kAll:
      return "every allocation";
    case Kind::kOnly:
      return absl::StrCat("tag '", tags_[0], "'");
    case Kind::kAllExcept:
      if (tags_.empty()) return "every allocation";
      return absl::StrCat("every allocation but tag", tags_.size() > 1 ? "s " : " ",
                          absl::StrJoin(tags_, ", ", quoted));
  }
  return "";
}

}  // namespace vmmshim
