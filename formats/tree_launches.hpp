// docs/numerics.md §5's pairwise tree of partial sums where the partials
// are (a device's memory), over a launcher (formats/kernel_launch.hpp):
// one launch per level of formats/quant_sums.hpp's TreeLevels (a thread per
// group of kTreeGroup items), so that a few thousand partials take three
// or four short launches and nothing crosses to the host. The caller's last
// launch (one thread) takes the value with tree_final. The additions are
// PartialTree's, in its operand order: the value equals tree_sum_of's on
// the host bit for bit. HostLaunch runs the same levels on the host (the
// emulation the tests compare).
#pragma once

#include <cstdint>
#include <utility>

#include "formats/kernel_launch.hpp"
#include "formats/quant_sums.hpp"

namespace exmy {

// The tree's levels over the n partials in a (n >= 0), with b room for
// n / kTreeGroup items and *tail (in the same memory) the level's tail:
// returns where the last level's items are (a or b) and sets n to their
// count (at most kTreeGroup), for tree_final(items, n, *tail).
template <class L, class P>
const P* tree_levels(const L& launch, P* a, P* b, int64_t& n, TreeTail<P>* tail) {
  launch("tree tail", 1, [=] EXMY_HD_LAMBDA(int64_t) { *tail = TreeTail<P>{}; });
  P* in = a;
  P* out = b;
  while (tree_needs_level(n)) {
    const int64_t items = n;
    const P* src = in;
    P* dst = out;
    launch("tree level", (items + kTreeGroup - 1) / kTreeGroup,
           [=] EXMY_HD_LAMBDA(int64_t g) { tree_level_group(src, items, g, dst, tail); });
    n = tree_level_items(items);
    std::swap(in, out);
  }
  return in;
}

// Room b needs for n partials (at least one item).
inline int64_t tree_scratch_items(int64_t n) { return n / kTreeGroup > 0 ? n / kTreeGroup : 1; }

}  // namespace exmy
