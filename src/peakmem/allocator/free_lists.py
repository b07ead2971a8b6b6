"""The sorted free lists of the allocator's block pools (`BlockPool::blocks`, `unmapped`).

`FreeList` is a `sortedcontainers.SortedList` (sorted sublists of at most 2 x `_load` keys and
their maxima) whose `add` and `remove` do the common case in one call: no positional index built
(only positional reads build one) and no sublist to split or join. Anything else goes to
SortedList's own code, so the order, the sublists and every other method are SortedList's: the
replay's results do not depend on which path ran (tests/allocator/test_replay_identity.py).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Any

from sortedcontainers import SortedList


class FreeList(SortedList):
    """A SortedList of free-block keys with a one-call `add` / `remove` / `delete_at`."""

    def add(self, value: Any) -> None:
        maxes = self._maxes
        if not maxes or self._index:
            SortedList.add(self, value)
            return
        pos = bisect_right(maxes, value)
        lists = self._lists
        if pos == len(maxes):
            pos -= 1
            sublist = lists[pos]
            sublist.append(value)
            maxes[pos] = value
        else:
            sublist = lists[pos]
            insort(sublist, value)
        self._len += 1
        if len(sublist) > self._load << 1:
            self._expand(pos)  # split the sublist (SortedList's own code)

    def remove(self, value: Any) -> None:
        maxes = self._maxes
        pos = bisect_left(maxes, value)
        if pos == len(maxes):
            raise ValueError(f"{value!r} not in list")
        lists = self._lists
        sublist = lists[pos]
        idx = bisect_left(sublist, value)
        if idx == len(sublist) or sublist[idx] != value:
            raise ValueError(f"{value!r} not in list")
        if len(lists) == 1 and not self._index:  # delete_at's common case, without the call
            del sublist[idx]
            self._len -= 1
            if sublist:
                maxes[0] = sublist[-1]
            else:
                del lists[0]
                del maxes[0]
            return
        self.delete_at(pos, idx)

    def delete_at(self, pos: int, idx: int) -> None:
        """Delete the key at index `idx` of sublist `pos` (SortedList._delete)."""
        lists = self._lists
        sublist = lists[pos]
        if self._index or (len(sublist) <= (self._load >> 1) + 1 and len(lists) > 1):
            self._delete(pos, idx)  # an index to keep, or a sublist to join with its neighbour
            return
        del sublist[idx]
        self._len -= 1
        if sublist:
            self._maxes[pos] = sublist[-1]
        else:  # the only sublist is empty now
            del lists[pos]
            del self._maxes[pos]
