"""Reading a captured trace in tests."""

from peakmem.trace.events import EventKind


def allocations(trace, category=None, op=None, phase=None):
    """(size, tag) of every ALLOC event matching the filters, in order."""
    found = []
    for index, (kind, _ident, size, _stream, _tag) in enumerate(trace.events()):
        if kind != EventKind.ALLOC:
            continue
        tag = trace.tag_of(index)
        if category is not None and (tag is None or tag.category != category):
            continue
        if op is not None and (tag is None or not (tag.op or "").startswith(op)):
            continue
        if phase is not None and (tag is None or tag.phase != phase):
            continue
        found.append((size, tag))
    return found
