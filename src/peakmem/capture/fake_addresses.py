"""Addresses for fake device storages.

Meta storages all report `data_ptr() == 0`, so libraries that tell storages apart by address
(transformers' and safetensors' shared-tensor checks before a save, `id_tensor_storage`) would
take every device tensor for one shared storage. During a capture each meta storage gets a fake,
distinct, 512-byte aligned address that stays the same for its lifetime, as a real one would.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_BASE = 0x7F00_0000_0000
_ALIGN = 512


class FakeAddresses:
    """Storage -> a fake base address, unique among live storages."""

    def __init__(self) -> None:
        self._bases: dict[int, int] = {}
        self._cursor = _BASE
        self._lock = threading.Lock()

    def of(self, storage: Any) -> int:
        key = id(storage)
        with self._lock:
            base = self._bases.get(key)
            if base is not None:
                return base
            base = self._cursor
            self._cursor += (-(-int(storage.nbytes()) // _ALIGN) + 1) * _ALIGN
            self._bases[key] = base
        weakref.finalize(storage, self._forget, key)
        return base

    def _forget(self, key: int) -> None:
        with self._lock:
            self._bases.pop(key, None)


ADDRESSES = FakeAddresses()


def tensor_address(tensor: Any) -> int:
    """`tensor.data_ptr()` of a meta tensor: its storage's fake base plus its offset."""
    return ADDRESSES.of(tensor.untyped_storage()) + tensor.storage_offset() * tensor.element_size()
