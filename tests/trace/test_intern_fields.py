"""`Trace.intern_fields` gives the indices `intern(Tag(...))` gives, in the same order."""

from hypothesis import given
from hypothesis import strategies as st

from peakmem.trace.events import NO_TAG, Tag, Trace

_FIELD = st.sampled_from([None, "", "activation", "parameter", "model.0", "forward", "addmm"])
_CALLS = st.lists(st.tuples(st.booleans(), _FIELD, _FIELD, _FIELD, _FIELD), max_size=40)


@given(calls=_CALLS)
def test_intern_fields_matches_intern_of_the_tag(calls):
    by_tag, by_fields = Trace(), Trace()
    for through_tag, *fields in calls:
        expected = by_tag.intern(Tag(*fields))
        got = by_fields.intern(Tag(*fields)) if through_tag else by_fields.intern_fields(*fields)
        assert got == expected
    assert by_fields.tags == by_tag.tags


def test_alloc_with_an_interned_tag_id():
    trace = Trace()
    first = trace.alloc(64, tag_id=trace.intern_fields("activation", "m", "forward", "relu"))
    second = trace.alloc(32, tag=Tag("activation", "m", "forward", "relu"))
    untagged = trace.alloc(16)
    all_none = trace.alloc(8, tag_id=trace.intern_fields(None, None, None, None))
    assert [first, second, untagged, all_none] == [0, 1, 2, 3]
    assert trace.tag_ids == [0, 0, NO_TAG, 1]
    assert trace.tags == [Tag("activation", "m", "forward", "relu"), Tag()]
