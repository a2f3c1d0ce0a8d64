// Other libraries' own VMM memory as the hooks record it
// (core/foreign/foreign_vmm.h) and as the residency report names it: a
// handle is held from cuMemCreate until its last reference and mapping go,
// host handles are not device memory, imports count what is mapped of them.
#include "core/foreign/foreign_vmm.h"

#include "core/allocator.h"
#include "core/report/residency.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/sim_test_base.h"

namespace vmmshim {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

CUmemAllocationProp OnDevice(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

uint64_t HeldOn(const ForeignVmm& f, int device) {
  for (const ForeignDeviceFigures& d : f.Figures()) {
    if (d.device == device) return d.bytes();
  }
  return 0;
}

TEST(ForeignVmmTest, AHandleIsHeldUntilItsLastReferenceAndMappingGo) {
  ForeignVmm f;
  f.Created(0x10, 20 * kMiB, OnDevice(0), "kv");
  EXPECT_EQ(HeldOn(f, 0), 20 * kMiB);
  f.Mapped(0x7000000, 20 * kMiB, 0x10);
  f.Released(0x10);  // still mapped: the driver keeps the memory
  EXPECT_EQ(HeldOn(f, 0), 20 * kMiB);
  f.Unmapped(0x7000000, 20 * kMiB);
  EXPECT_EQ(HeldOn(f, 0), 0u);
  EXPECT_TRUE(f.Figures().empty());

  // A retain is one more reference to release.
  f.Created(0x20, 2 * kMiB, OnDevice(1), "");
  f.Retained(0x20);
  f.Released(0x20);
  EXPECT_EQ(HeldOn(f, 1), 2 * kMiB);
  f.Released(0x20);
  EXPECT_EQ(HeldOn(f, 1), 0u);
}

TEST(ForeignVmmTest, TagsExportsImportsAndHostHandles) {
  ForeignVmm f;
  f.Created(0x1, 4 * kMiB, OnDevice(0), "weights");
  f.Created(0x2, 6 * kMiB, OnDevice(0), "");
  f.Exported(0x2);
  CUmemAllocationProp host = {};
  host.location.type = CU_MEM_LOCATION_TYPE_HOST;
  f.Created(0x3, 64 * kMiB, host, "");  // not device memory
  const CUmemAllocationProp dev0 = OnDevice(0);
  f.Imported(0x4, &dev0);
  EXPECT_EQ(HeldOn(f, 0), 10 * kMiB);  // an import counts once mapped
  f.Mapped(0x9000000, 8 * kMiB, 0x4);
  f.Mapped(0x5000000, 2 * kMiB, 0x99);  // a handle it never saw made: ignored
  const std::vector<ForeignDeviceFigures> figures = f.Figures();
  ASSERT_EQ(figures.size(), 1u);
  EXPECT_EQ(figures[0].by_tag.at("weights"), 4 * kMiB);
  EXPECT_EQ(figures[0].by_tag.at(""), 6 * kMiB);
  EXPECT_EQ(figures[0].exported_bytes, 6 * kMiB);
  EXPECT_EQ(figures[0].imported_bytes, 8 * kMiB);
  EXPECT_EQ(figures[0].handles, 3u);
  // cuMemUnmap of a range covering several mappings takes them all.
  f.Mapped(0x9800000, 2 * kMiB, 0x1);
  f.Unmapped(0x9000000, 10 * kMiB);
  f.Released(0x4);
  EXPECT_EQ(HeldOn(f, 0), 10 * kMiB);
}

class ForeignResidencyTest : public SimTest {};

TEST_F(ForeignResidencyTest, TheResidencyReportNamesOtherLibrariesMemory) {
  StartSim(2, 256 * kMiB);
  MakeCurrent(0);
  Allocator a(api_);
  // The allocator's own memory, and memory "another library" made itself
  // on device 1, where the shim served nothing.
  const CUdeviceptr own = MustAllocate(a, 4 * kMiB);
  a.foreign().Created(0x42, 32 * kMiB, OnDevice(1), "nccl");
  const nlohmann::json doc = nlohmann::json::parse(ResidencyJson(a, nullptr));
  ASSERT_EQ(doc["devices"].size(), 2u);
  EXPECT_EQ(doc["devices"][0]["other_libraries_vmm"]["bytes"], 0u);
  EXPECT_EQ(doc["devices"][1]["device"], 1);
  EXPECT_EQ(doc["devices"][1]["other_libraries_vmm"]["bytes"], 32 * kMiB);
  EXPECT_EQ(doc["devices"][1]["other_libraries_vmm"]["by_tag"]["nccl"], 32 * kMiB);
  EXPECT_EQ(doc["devices"][1]["shim"]["resident_bytes"], 0u);
  ASSERT_TRUE(a.Free(own).ok());
}

}  // namespace
}  // namespace vmmshim
