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


def live_at_end(trace) -> list[int]:
    """Sizes of the allocations never freed (the job kept them until it ended), sorted."""
    live = {}
    for kind, ident, size, _stream, _tag in trace.events():
        if kind == EventKind.ALLOC:
            live[ident] = size
        elif kind == EventKind.FREE:
            live.pop(ident, None)
    return sorted(live.values())
