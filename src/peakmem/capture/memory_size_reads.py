"""Scripts that size themselves from the GPU they find: a batch size from
`torch.cuda.get_device_properties(0).total_memory` or `torch.cuda.mem_get_info()`. During a
capture both answer for the target GPU (--gpu), so what the job derives from them is what it
would choose on that GPU; the note says so, since the estimate then changes with --gpu beyond
the capacity it is compared to."""

from __future__ import annotations

from peakmem.capture.session import CaptureSession

NOTE_PREFIX = "the job (or a library it calls) read the GPU's memory size"


def note_memory_size_read(session: CaptureSession, how: str) -> None:
    """Once per capture: the job read the device's memory size (`how`: the call it made)."""
    if any(note.startswith(NOTE_PREFIX) for note in session.notes):
        return
    gpu = session.gpu
    session.notes.append(
        f"{NOTE_PREFIX} ({how}): it was answered for the target GPU ({gpu.name}, "
        f"{gpu.total_memory_bytes / 2**30:.1f} GiB), so sizes the job chose from it (a batch "
        "size, a cache) are those it would choose on that GPU; the estimate follows --gpu"
    )
