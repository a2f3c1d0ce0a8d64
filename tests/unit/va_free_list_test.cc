#include "core/heap/va_free_list.h"

#include "gtest/gtest.h"

namespace vmmshim {
namespace {

constexpr size_t kG = size_t{2} << 20;

TEST(VaFreeListTest, BestFitAndCoalescing) {
  VaFreeList arena(kG);
  arena.AddReservation(100 * kG, 10 * kG);
  auto a = arena.Allocate(2 * kG);
  auto b = arena.Allocate(3 * kG);
  auto c = arena.Allocate(kG);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 100 * kG);
  EXPECT_EQ(*b, 102 * kG);
  EXPECT_EQ(*c, 105 * kG);
  arena.Free(*b, 3 * kG);
  // Best fit: a 1-granule request goes to the 3-granule hole, not the tail.
  auto d = arena.Allocate(kG);
  EXPECT_EQ(*d, 102 * kG);
  arena.Free(*d, kG);
  arena.Free(*a, 2 * kG);
  arena.Free(*c, kG);
  EXPECT_EQ(arena.free_bytes(), 10 * kG);
  // Fully coalesced again: one allocation of the whole reservation fits.
  auto whole = arena.Allocate(10 * kG);
  ASSERT_TRUE(whole);
  EXPECT_EQ(*whole, 100 * kG);
  EXPECT_FALSE(arena.Allocate(kG));
}

TEST(VaFreeListTest, NeverCoalescesAcrossReservations) {
  VaFreeList arena(kG);
  arena.AddReservation(0x1000 * kG, 2 * kG);
  arena.AddReservation(0x1002 * kG, 2 * kG);  // adjacent in VA
  EXPECT_FALSE(arena.Allocate(3 * kG));
  auto a = arena.Allocate(2 * kG);
  auto b = arena.Allocate(2 * kG);
  ASSERT_TRUE(a && b);
  arena.Free(*a, 2 * kG);
  arena.Free(*b, 2 * kG);
  EXPECT_FALSE(arena.Allocate(4 * kG));
  EXPECT_TRUE(arena.Contains(0x1003 * kG));
  EXPECT_FALSE(arena.Contains(0x1004 * kG));
}

}  // namespace
}  // namespace vmmshim
