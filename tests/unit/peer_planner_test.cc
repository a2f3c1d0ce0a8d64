// The peer-access planner (core/peer/peer_access.h): a pure function from blocks
// (and their targets) to cuMemSetAccess runs, tested without a driver.
#include <vector>

#include "core/heap/device_heap.h"
#include "core/peer/peer_access.h"
#include "gtest/gtest.h"

namespace vmmshim {
namespace {

constexpr size_t kG = size_t{2} << 20;
constexpr CUdeviceptr kR = 0x100000000;  // a reservation base

DeviceSet Set(std::initializer_list<int> devices) {
  DeviceSet s;
  for (int d : devices) s.Add(d);
  return s;
}

AccessBlock Block(int index, DeviceSet access, DeviceSet target, CUdeviceptr reservation = kR) {
  return AccessBlock{kR + index * kG, kG, reservation, access, target};
}

TEST(PeerPlannerTest, AdjacentBlocksThatChangeAlikeShareOneRun) {
  std::vector<AccessBlock> blocks = {Block(0, Set({0}), Set({0, 1})),
                                     Block(1, Set({0}), Set({0, 1})),
                                     Block(2, Set({0}), Set({0, 1}))};
  std::vector<AccessRun> runs = PlanAccess(blocks);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].base, kR);
  EXPECT_EQ(runs[0].size, 3 * kG);
  EXPECT_EQ(runs[0].grant, Set({1}));
  EXPECT_TRUE(runs[0].revoke.empty());
  EXPECT_EQ(runs[0].first, 0u);
  EXPECT_EQ(runs[0].count, 3u);
}

TEST(PeerPlannerTest, BlocksAtTheirTargetSplitRunsAndStartNone) {
  std::vector<AccessBlock> blocks = {Block(0, Set({0}), Set({0, 1})),
                                     Block(1, Set({0}), Set({0})),  // unchanged
                                     Block(2, Set({0}), Set({0, 1}))};
  std::vector<AccessRun> runs = PlanAccess(blocks);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].count, 1u);
  EXPECT_EQ(runs[1].first, 2u);
}

TEST(PeerPlannerTest, DifferentChangesGapsAndReservationsSplitRuns) {
  std::vector<AccessBlock> blocks = {
      Block(0, Set({0}), Set({0, 1})),
      Block(1, Set({0}), Set({0, 1, 2})),                // another grant set
      Block(3, Set({0}), Set({0, 1, 2})),                // a hole before it
      Block(4, Set({0}), Set({0, 1, 2}), kR + 4 * kG)};  // another reservation
  EXPECT_EQ(PlanAccess(blocks).size(), 4u);
}

TEST(PeerPlannerTest, GrantsAndRevokesTogetherInOneRun) {
  std::vector<AccessBlock> blocks = {Block(0, Set({0, 1}), Set({0, 2})),
                                     Block(1, Set({0, 1}), Set({0, 2}))};
  std::vector<AccessRun> runs = PlanAccess(blocks);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].grant, Set({2}));
  EXPECT_EQ(runs[0].revoke, Set({1}));
}

TEST(PeerPlannerTest, NothingToChangeMeansNoCall) {
  std::vector<AccessBlock> blocks = {Block(0, Set({0, 1}), Set({0, 1}))};
  EXPECT_TRUE(PlanAccess(blocks).empty());
  EXPECT_TRUE(PlanAccess({}).empty());
}

TEST(PeerPlannerTest, TargetCombinesPolicyEnabledPeersAndExplicitState) {
  // Allowed {1,2}, enabled {2,3}: policy grants 2; explicit grant 3 wins over
  // "not allowed"; explicit revoke 2 wins over the policy; the owner always.
  EXPECT_EQ(TargetAccess(0, Set({0, 1, 2}), DeviceSet(), DeviceSet(), Set({2, 3})), Set({0, 2}));
  EXPECT_EQ(TargetAccess(0, Set({0, 1, 2}), Set({3}), DeviceSet(), Set({2, 3})),
            Set({0, 2, 3}));
  EXPECT_EQ(TargetAccess(0, Set({0, 1, 2}), DeviceSet(), Set({2}), Set({2, 3})), Set({0}));
  EXPECT_EQ(TargetAccess(0, DeviceSet(), DeviceSet(), Set({0}), DeviceSet()), Set({0}));
}

TEST(PeerPlannerTest, EnableTableNestsAndReportsTheLast) {
  PeerEnableTable t;
  EXPECT_TRUE(t.Enable(1, 0));
  EXPECT_FALSE(t.Enable(1, 0));
  EXPECT_EQ(t.Enabled(0), Set({1}));
  EXPECT_FALSE(*t.Disable(1, 0));
  EXPECT_TRUE(*t.Disable(1, 0));
  EXPECT_TRUE(t.Enabled(0).empty());
  EXPECT_FALSE(t.Disable(1, 0).ok());
}

TEST(DeviceSetTest, Basics) {
  DeviceSet s = DeviceSet::FirstN(3);
  EXPECT_EQ(s.size(), 3);
  EXPECT_TRUE(s.Contains(2));
  EXPECT_FALSE(s.Contains(3));
  EXPECT_FALSE(s.Contains(-1));
  EXPECT_FALSE(s.Contains(kMaxDevices));
  EXPECT_TRUE(DeviceSet::Of(kMaxDevices).empty());
  EXPECT_EQ(DeviceSet::FirstN(kMaxDevices).size(), kMaxDevices);
  EXPECT_EQ((s - DeviceSet::Of(1)).ToVector(), (std::vector<int>{0, 2}));
}

}  // namespace
}  // namespace vmmshim
