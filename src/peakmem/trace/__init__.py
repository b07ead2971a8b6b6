"""The trace: an ordered list of device-memory events with tags (category, module, phase, op)."""

from peakmem.trace.events import EventKind, Tag, Trace
from peakmem.trace.vocab import Category, Phase

__all__ = ["Category", "EventKind", "Phase", "Tag", "Trace"]
