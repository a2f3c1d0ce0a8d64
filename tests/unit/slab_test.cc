#include "core/heap/slab.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace vmmshim {
namespace {

constexpr size_t kG = size_t{2} << 20;

TEST(SlabTest, AllocationsAreAlignedAsTheDriverAlignsAndDisjoint) {
  Slab slab(kG);
  std::vector<std::pair<size_t, size_t>> taken;
  for (size_t bytes : {1, 255, 256, 257, 4096, 100000, 3, 1000, 65536, 1500, 3000}) {
    auto off = slab.Allocate(bytes);
    ASSERT_TRUE(off);
    EXPECT_EQ(*off % 512, 0u);
    EXPECT_EQ(*off % Slab::Alignment(bytes), 0u) << bytes;
    for (auto [o, n] : taken) EXPECT_TRUE(*off >= o + n || *off + bytes <= o);
    taken.push_back({*off, bytes});
  }
}

// The driver's alignment, measured on H200 (slab.h).
TEST(SlabTest, AlignmentIsTheLowestBitOfTheSizeRoundedTo512) {
  EXPECT_EQ(Slab::Alignment(1), 512u);
  EXPECT_EQ(Slab::Alignment(512), 512u);
  EXPECT_EQ(Slab::Alignment(513), 1024u);
  EXPECT_EQ(Slab::Alignment(1024), 1024u);
  EXPECT_EQ(Slab::Alignment(1025), 512u);
  EXPECT_EQ(Slab::Alignment(3000), 1024u);
  EXPECT_EQ(Slab::Alignment(4096), 4096u);
  EXPECT_EQ(Slab::Alignment(10000), 2048u);
  EXPECT_EQ(Slab::Alignment(65536), 65536u);
  EXPECT_EQ(Slab::Alignment(100000), 2048u);
  EXPECT_EQ(Slab::Alignment(size_t{1} << 20), size_t{1} << 20);
}

TEST(SlabTest, PacksTinyAllocationsDensely) {
  Slab slab(kG);
  for (int i = 0; i < 4096; ++i) ASSERT_TRUE(slab.Allocate(256)) << i;
  EXPECT_FALSE(slab.Allocate(1));
  EXPECT_EQ(slab.used_bytes(), kG);
}

TEST(SlabTest, FreeRejectsInteriorAndDoubleFree) {
  Slab slab(kG);
  auto a = slab.Allocate(1000);
  ASSERT_TRUE(a);
  EXPECT_FALSE(slab.Free(*a + 512));
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
  for (int i = 0; i < 4096; ++i) offs.push_back(*slab.Allocate(256));
  ASSERT_TRUE(slab.Free(offs[100]));
  ASSERT_TRUE(slab.Free(offs[101]));
  // The search starts at the hole made last (LIFO), then goes on first fit.
  auto again = slab.Allocate(512);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, offs[101]);
  again = slab.Allocate(512);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, offs[100]);
}

// The word-at-a-time search against a unit-at-a-time model of the same
// rule (first fit of a start aligned to the lowest set bit of the unit
// count, from the hint, then from the start; the hint follows the last
// allocation and moves to each hole a free makes), on a slab whose size
// is not a multiple of 64 units, with runs that cross words.
TEST(SlabTest, MatchesAUnitByUnitModel) {
  constexpr size_t kUnits = 1000;
  Slab slab(kUnits * Slab::kUnit);
  std::vector<bool> used(kUnits, false);
  size_t hint = 0;
  // First fit of an aligned start: unit by unit, every multiple of `align`.
  auto model_find = [&](size_t from, size_t count) -> std::optional<size_t> {
    const size_t align = count & (~count + 1);
    for (size_t u = (from + align - 1) / align * align; u + count <= kUnits; u += align) {
      size_t n = 0;
      while (n < count && !used[u + n]) ++n;
      if (n == count) return u;
    }
    return std::nullopt;
  };
  std::mt19937 rng(7);
  std::vector<std::pair<size_t, size_t>> live;  // offset, bytes
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const size_t bytes = 1 + rng() % (rng() % 4 == 0 ? 100 * Slab::kUnit : 3 * Slab::kUnit);
      const size_t count = (bytes + Slab::kUnit - 1) / Slab::kUnit;
      std::optional<size_t> want = model_find(hint, count);
      if (!want && hint != 0) want = model_find(0, count);
      std::optional<size_t> got = slab.Allocate(bytes);
      ASSERT_EQ(got.has_value(), want.has_value()) << "step " << step;
      if (!got) continue;
      ASSERT_EQ(*got, *want * Slab::kUnit) << "step " << step;
      for (size_t u = *want; u < *want + count; ++u) used[u] = true;
      hint = *want + count == kUnits ? 0 : *want + count;
      live.emplace_back(*got, bytes);
    } else {
      const size_t i = rng() % live.size();
      ASSERT_EQ(slab.Free(live[i].first), live[i].second);
      const size_t first = live[i].first / Slab::kUnit;
      for (size_t u = first; u < first + (live[i].second + Slab::kUnit - 1) / Slab::kUnit; ++u) {
        used[u] = false;
      }
      hint = first;  // the next search starts at the hole just made
      live[i] = live.back();
      live.pop_back();
    }
  }
}

// Against brute force: alignment, disjointness, and whether an aligned free
// run exists, for 200 slabs x 3000 random steps (written by the review).
TEST(SlabTest, MatchesBruteForceOnRandomSizes) {
  std::mt19937_64 rng(1);
  for (int round = 0; round < 200; ++round) {
    Slab slab(2 << 20);
    const size_t units = (2 << 20) / Slab::kUnit;
    std::vector<int> used(units, 0);
    std::map<size_t, size_t> live;  // offset -> bytes
    for (int step = 0; step < 3000; ++step) {
      if (!live.empty() && rng() % 2) {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        ASSERT_EQ(slab.Free(it->first), it->second);
        const size_t n = (it->second + 511) / 512;
        for (size_t u = it->first / 512; u < it->first / 512 + n; ++u) used[u] = 0;
        live.erase(it);
        continue;
      }
      const size_t choices[] = {1, 512, 513, 1024, 1500, 3000, 4096, 65536, 100000, 1 << 20};
      const size_t bytes = choices[rng() % 10] + (rng() % 3 == 0 ? rng() % 2048 : 0);
      const size_t n = (bytes + 511) / 512;
      const size_t align = n & (~n + 1);
      std::optional<size_t> off = slab.Allocate(bytes);
      bool exists = false;
      for (size_t s = 0; s + n <= units && !exists; s += align) {
        bool ok = true;
        for (size_t u = s; u < s + n; ++u) {
          if (used[u]) {
            ok = false;
            break;
          }
        }
        exists = ok;
      }
      ASSERT_EQ(off.has_value(), exists) << bytes;
      if (!off) continue;
      ASSERT_EQ(*off % (align * 512), 0u);
      for (size_t u = *off / 512; u < *off / 512 + n; ++u) {
        ASSERT_EQ(used[u], 0);
        used[u] = 1;
      }
      live[*off] = bytes;
    }
  }
}

// The flat index (slab.h) against a std::map of the live allocations: after
// every random Allocate, Free, Find or Resize the slab answers as the map
// does, including Find of interior offsets of allocations that span several
// words of the start bitmap, double frees, frees and resizes of interior
// offsets, and offsets past the end. Two sizes: 1,000 units (not a multiple
// of 64, so the last word is partial) and a 2 MiB granule.
TEST(SlabTest, IndexMatchesAMapOfLiveAllocations) {
  for (const size_t units : {size_t{1000}, kG / Slab::kUnit}) {
    const size_t size = units * Slab::kUnit;
    Slab slab(size);
    std::map<size_t, size_t> live;  // offset -> requested bytes
    std::vector<size_t> freed;      // recently freed offsets (double-free probes)
    std::mt19937_64 rng(23);
    size_t requested = 0, used_units = 0;
    auto units_of = [](size_t bytes) { return (bytes + Slab::kUnit - 1) / Slab::kUnit; };
    // The model's Find: the allocation containing `offset`, if any.
    auto model_find = [&](size_t offset) -> std::optional<std::pair<size_t, size_t>> {
      auto it = live.upper_bound(offset);
      if (it == live.begin()) return std::nullopt;
      --it;
      if (offset >= it->first + units_of(it->second) * Slab::kUnit) return std::nullopt;
      return *it;
    };
    auto random_live = [&] {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      return it;
    };
    for (int step = 0; step < 40000; ++step) {
      SCOPED_TRACE(::testing::Message() << "units " << units << ", step " << step);
      const int op = static_cast<int>(rng() % 8);
      if (op <= 2 || live.empty()) {  // allocate: 1 B .. 100 units
        const size_t bytes = 1 + rng() % (rng() % 4 == 0 ? 100 * Slab::kUnit : 3 * Slab::kUnit);
        std::optional<size_t> off = slab.Allocate(bytes);
        if (!off) continue;  // when it may fail is MatchesAUnitByUnitModel's subject
        ASSERT_EQ(*off % Slab::Alignment(bytes), 0u);
        ASSERT_LE(*off + units_of(bytes) * Slab::kUnit, size);
        // Disjoint from its neighbours in the model.
        auto next = live.lower_bound(*off);
        if (next != live.end()) {
          ASSERT_GE(next->first, *off + units_of(bytes) * Slab::kUnit);
        }
        if (next != live.begin()) {
          auto prev = std::prev(next);
          ASSERT_LE(prev->first + units_of(prev->second) * Slab::kUnit, *off);
        }
        live[*off] = bytes;
        requested += bytes;
        used_units += units_of(bytes);
        freed.erase(std::remove(freed.begin(), freed.end(), *off), freed.end());
      } else if (op == 3) {  // free a live allocation
        auto it = random_live();
        ASSERT_EQ(slab.Free(it->first), it->second);
        requested -= it->second;
        used_units -= units_of(it->second);
        freed.push_back(it->first);
        if (freed.size() > 64) freed.erase(freed.begin());
        live.erase(it);
      } else if (op == 4) {  // free what is not an allocation's start
        size_t offset;
        if (rng() % 2 == 0 && !freed.empty()) {
          offset = freed[rng() % freed.size()];  // a double free (unless reused: then live)
        } else if (rng() % 2 == 0) {
          auto it = random_live();
          offset = it->first + Slab::kUnit * (1 + rng() % units_of(it->second));  // interior or after
        } else {
          offset = (rng() % (units + 70)) * Slab::kUnit + (rng() % 4 == 0 ? rng() % 512 : 0);
        }
        auto it = live.find(offset);
        if (it == live.end()) {
          ASSERT_FALSE(slab.Free(offset)) << offset;
        } else {
          ASSERT_EQ(slab.Free(offset), it->second);
          requested -= it->second;
          used_units -= units_of(it->second);
          freed.push_back(it->first);
          live.erase(it);
        }
      } else if (op <= 6) {  // find: interior offsets, starts, free bytes, past the end
        size_t offset;
        if (rng() % 2 == 0) {
          auto it = random_live();
          offset = it->first + rng() % (units_of(it->second) * Slab::kUnit + Slab::kUnit);
        } else {
          offset = rng() % (size + 64 * Slab::kUnit);
        }
        ASSERT_EQ(slab.Find(offset), model_find(offset)) << offset;
      } else {  // resize: same units (succeeds), other units or not a start (fails)
        auto it = random_live();
        const size_t n = units_of(it->second);
        size_t bytes = (n - 1) * Slab::kUnit + 1 + rng() % Slab::kUnit;  // same units
        if (rng() % 3 == 0) bytes += Slab::kUnit;                     // one more
        size_t offset = it->first;
        if (rng() % 4 == 0) offset += n > 1 ? Slab::kUnit : 1;        // interior
        const bool ok = offset == it->first && units_of(bytes) == n;
        ASSERT_EQ(slab.Resize(offset, bytes), ok);
        if (ok) {
          requested = requested - it->second + bytes;
          it->second = bytes;
        }
      }
      ASSERT_EQ(slab.allocations(), live.size());
      ASSERT_EQ(slab.requested_bytes(), requested);
      ASSERT_EQ(slab.used_bytes(), used_units * Slab::kUnit);
      ASSERT_EQ(slab.empty(), live.empty());
    }
    for (const auto& [offset, bytes] : live) ASSERT_EQ(slab.Free(offset), bytes);
    EXPECT_TRUE(slab.empty());
    EXPECT_EQ(slab.requested_bytes(), 0u);
    EXPECT_FALSE(slab.Find(0));
  }
}

// Find of the last byte of a run of allocations that fill whole words of
// the start bitmap, and of an allocation starting at unit 0 (the backward
// scan stops at the first word).
TEST(SlabTest, FindScansBackAcrossWords) {
  Slab slab(kG);
  auto big = slab.Allocate(1 << 20);  // 2048 units, 32 words of starts
  ASSERT_EQ(big, 0u);
  for (size_t offset : {size_t{0}, size_t{511}, size_t{64 * 512}, size_t{(1 << 20) - 1}}) {
    auto found = slab.Find(offset);
    ASSERT_TRUE(found) << offset;
    EXPECT_EQ(*found, std::make_pair(size_t{0}, size_t{1} << 20)) << offset;
  }
  EXPECT_FALSE(slab.Find(1 << 20));
  auto next = slab.Allocate(512);
  ASSERT_EQ(next, size_t{1} << 20);
  EXPECT_EQ(slab.Find((1 << 20) + 100), std::make_pair(size_t{1} << 20, size_t{512}));
  EXPECT_EQ(slab.Find((1 << 20) - 1), std::make_pair(size_t{0}, size_t{1} << 20));
  EXPECT_FALSE(slab.Find(kG));
  EXPECT_FALSE(slab.Free(kG));
  EXPECT_FALSE(slab.Resize(kG, 512));
}
}  // namespace
}  // namespace vmmshim
