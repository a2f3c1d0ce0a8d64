// The lock order is written once (core/sync/lock_order.h); docs/architecture.md
// shows it. This fails when the document's list and the header differ, or a
// row names a declaration that does not exist.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/sync/lock_order.h"
#include "gtest/gtest.h"

namespace vmmshim {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The names of the numbered list under "### Lock order" (each item starts
// "N. **name**").
std::vector<std::string> DocumentedOrder(const std::string& doc) {
  std::vector<std::string> names;
  const size_t section = doc.find("### Lock order");
  if (section == std::string::npos) return names;
  std::istringstream lines(doc.substr(section));
  std::string line;
  std::getline(lines, line);  // the heading
  while (std::getline(lines, line)) {
    if (line.rfind("#", 0) == 0) break;  // the next section
    const size_t dot = line.find(". **");
    if (dot == std::string::npos || dot > 3) continue;
    const size_t end = line.find("**", dot + 4);
    if (end == std::string::npos) continue;
    names.push_back(line.substr(dot + 4, end - dot - 4));
  }
  return names;
}

TEST(LockOrderTest, ArchitectureDocumentShowsTheHeadersOrder) {
  const std::string doc = ReadFile(std::string(VMMSHIM_SOURCE_DIR) + "/docs/architecture.md");
  ASSERT_FALSE(doc.empty());
  std::vector<std::string> expected;
  for (const LockRank& rank : kLockOrder) expected.emplace_back(rank.name);
  EXPECT_EQ(DocumentedOrder(doc), expected)
      << "docs/architecture.md '### Lock order' must list core/sync/lock_order.h's kLockOrder";
}

TEST(LockOrderTest, EveryRowNamesADeclarationThatExists) {
  for (const LockRank& rank : kLockOrder) {
    const std::string where(rank.where);
    // "Class::member_ (core/path.h)"
    const size_t open = where.find(" (");
    ASSERT_NE(open, std::string::npos) << where;
    const std::string member = where.substr(where.find("::") + 2, open - where.find("::") - 2);
    const std::string file = where.substr(open + 2, where.find(')', open) - open - 2);
    const std::string text = ReadFile(std::string(VMMSHIM_SOURCE_DIR) + "/" + file);
    ASSERT_FALSE(text.empty()) << file << " (row " << rank.name << ")";
    EXPECT_NE(text.find(" " + member), std::string::npos)
        << member << " is not declared in " << file << " (row " << rank.name << ")";
  }
}

}  // namespace
}  // namespace vmmshim
