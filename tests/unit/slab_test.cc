#include "core/slab.h"

#include <vector>

#include "gtest/gtest.h"

namespace vmmshim {
namespace {

constexpr size_t kG = size_t{2} << 20;

TEST(SlabTest, AllocationsAre256ByteAlignedAndDisjoint) {
  Slab slab(kG);
  std::vector<std::pair<size_t, size_t>> taken;
  for (size_t bytes : {1, 255, 256, 257, 4096, 100000, 3}) {
    auto off = slab.Allocate(bytes);
    ASSERT_TRUE(off);
    EXPECT_EQ(*off % 256, 0u);
    for (auto [o, n] : taken) EXPECT_TRUE(*off >= o + n || *off + bytes <= o);
    taken.push_back({*off, bytes});
  }
}

TEST(SlabTest, PacksTinyAllocationsDensely) {
  Slab slab(kG);
  for (int i = 0; i < 8192; ++i) ASSERT_TRUE(slab.Allocate(256)) << i;
  EXPECT_FALSE(slab.Allocate(1));
  EXPECT_EQ(slab.used_bytes(), kG);
}

TEST(SlabTest, FreeRejectsInteriorAndDoubleFree) {
  Slab slab(kG);
  auto a = slab.Allocate(1000);
  ASSERT_TRUE(a);
  EXPECT_FALSE(slab.Free(*a + 256));
  auto found = slab.Find(*a + 999);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->first, *a);
  EXPECT_EQ(found->second, 1000u);
  EXPECT_EQ(slab.Free(*a), 1000u);
  EXPECT_FALSE(slab.Free(*a));
  EXPECT_FALSE(slab.Find(*a));
  EXPECT_TRUE(slab.empty());
}

TEST(SlabTest, ReusesFreedHoles) {
  Slab slab(kG);
  std::vector<size_t> offs;
  for (int i = 0; i < 8192; ++i) offs.push_back(*slab.Allocate(256));
  ASSERT_TRUE(slab.Free(offs[100]));
  ASSERT_TRUE(slab.Free(offs[101]));
  auto again = slab.Allocate(512);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, offs[100]);
}

}  // namespace
}  // namespace vmmshim
