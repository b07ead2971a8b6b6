"""`UntypedStorage.resize_` on device storages: memory given back and taken again while the
storage object lives on.

FSDP frees a layer's unsharded parameters with `tensor.untyped_storage().resize_(0)` after it
ran (FSDP2's `free_storage`, FSDP1's `_free_storage` through `TypedStorage._resize_`) and
re-allocates them with `resize_(nbytes)` before the next all-gather. On CUDA, `resize_` is
`resize_bytes_cuda`: a new block of the new size from the caching allocator, the old contents
copied, then the old block freed (`resize_(0)` only frees). The recorder sees storages when an
op returns them and frees them when they die, so without this a resized storage kept its first
size for its whole life: every FSDP estimate counted the unsharded parameters as always live.

Here, for a device storage (not a host tensor kept fake, not the job's own meta tensor):
- `resize_(0)` frees its allocation;
- `resize_(n)` from empty allocates n bytes (tagged with the category the storage had before);
- `resize_(n)` from m > 0, n != m: allocates n bytes, then frees the m.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from peakmem.capture.session import CaptureSession
from peakmem.trace.events import Tag

OP = "storage.resize_"


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    original = torch.UntypedStorage.resize_
    emptied: dict[int, str | None] = {}
    """id(storage) -> the category of a device storage resized to 0 bytes (until it dies)."""
    watched: set[int] = set()

    def forget(key: int) -> None:
        emptied.pop(key, None)
        watched.discard(key)

    def resize_(self: Any, size: Any) -> Any:
        before = self.nbytes()
        out = original(self, size)
        if self.device.type != "meta" or session.closed:
            return out
        after = self.nbytes()
        if after == before:
            return out
        key = id(self)
        if session.storage_kinds.get(key, "device") != "device":
            return out
        record = session.live.get(key)
        category = emptied.pop(key, None)
        if record is not None:
            category = _category(session, record.alloc_index)
        elif before > 0:
            return out  # never tracked (made outside the capture): not the job's device memory
        if after > 0:  # the new block first, then the old one goes (resize_bytes_cuda)
            if record is not None:
                session.live.pop(key, None)
            session.track_storage(self, OP, category or session.default_category(OP))
            if record is not None and not session.closed:
                session._free(record.ident, record.nbytes)
        else:
            session.untrack_storage(self)
            if record is not None:
                emptied[key] = category
                if key not in watched:
                    watched.add(key)
                    weakref.finalize(self, forget, key)
        return out

    return {(torch.UntypedStorage, "resize_"): resize_}


def _category(session: CaptureSession, alloc_index: int) -> str | None:
    tag: Tag | None = session.trace.tag_of(alloc_index)
    return None if tag is None else tag.category
