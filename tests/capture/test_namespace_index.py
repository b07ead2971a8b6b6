"""The cached search of module namespaces finds what a full read of every namespace finds."""

import sys
import types
import unittest.mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peakmem.capture import namespace_index
from peakmem.capture.namespace_index import NamespaceIndex, namespaces_binding_uncached


def _ids(namespaces):
    return [id(namespace) for namespace in namespaces]


def test_dict_versions_are_read_on_this_interpreter():
    """CPython 3.11 (the project's): the cache is on, and a version moves on every write."""
    read = namespace_index.dict_version
    assert read is not None
    namespace = {"a": 1}
    first = read(namespace)
    namespace["a"] = 2
    second = read(namespace)
    namespace["b"] = 3
    third = read(namespace)
    del namespace["a"]
    assert len({first, second, third, read(namespace)}) == 4
    assert read({}) != read({})  # every new dict a version of its own


@pytest.fixture
def modules(monkeypatch):
    made = {}

    def make(name):
        module = types.ModuleType(name)
        module.filler = 0
        monkeypatch.setitem(sys.modules, name, module)
        made[name] = module
        return module

    return make


def test_a_rebinding_between_two_searches_is_found(modules):
    def save():
        pass

    index = NamespaceIndex()
    first, second = modules("peakmem_test_ns_a"), modules("peakmem_test_ns_b")
    assert _ids(index.namespaces_binding({id(save)})) == []
    second.filler = save  # same names, same length: only the version tells
    assert _ids(index.namespaces_binding({id(save)})) == [id(vars(second))]
    third = modules("peakmem_test_ns_c")
    third.renamed = save
    del second.filler
    found = _ids(index.namespaces_binding({id(save)}))
    assert found == [id(vars(third))] == _ids(namespaces_binding_uncached({id(save)}))
    assert id(vars(first)) not in found


def test_unchanged_namespaces_are_not_read_again(modules):
    index = NamespaceIndex()
    module = modules("peakmem_test_ns_kept")
    list(index.namespaces_binding({id(object())}))
    assert index._seen[id(vars(module))][1] is None  # one search: the version only
    list(index.namespaces_binding({id(object())}))
    kept = index._seen[id(vars(module))]
    assert kept[1] == frozenset(map(id, vars(module).values()))  # seen again: its ids kept
    list(index.namespaces_binding({id(object())}))
    assert index._seen[id(vars(module))] is kept  # the same record: not re-read
    module.filler = 1
    list(index.namespaces_binding({id(object())}))
    assert index._seen[id(vars(module))][1] is None  # changed: read, the new version noted


_VALUES = st.integers(0, 3)  # 0-2: the wanted functions; 3: something else
_STEPS = st.lists(
    st.tuples(st.sampled_from(["bind", "delete", "replace_module", "search"]),
              st.integers(0, 2), st.sampled_from(["x", "y", "filler"]), _VALUES),
    max_size=10,  # each step's full read scans every loaded module (thousands in a worker)
)


_REAL_MODULES = 200
"""How many of the worker's loaded modules the property test searches beside its own three (a
full read scans every module given: in a worker that imported the libraries' jobs, thousands)."""


@settings(max_examples=60, deadline=None)
@given(steps=_STEPS, wanted=st.sets(st.integers(0, 2), min_size=1))
def test_the_cached_search_matches_a_full_read(steps, wanted):
    functions = [lambda: 0, lambda: 1, lambda: 2, "something else"]
    names = [f"peakmem_test_ns_h{i}" for i in range(3)]
    # the index reads `sys.modules` through its module's `sys`: a stand-in holding the first
    # loaded modules and the test's own keeps each step's full read small, in sys.modules' order
    loaded = dict(list(sys.modules.items())[:_REAL_MODULES])
    for name in names:
        loaded[name] = types.ModuleType(name)
    with unittest.mock.patch.object(namespace_index, "sys", types.SimpleNamespace(modules=loaded)):
        index = NamespaceIndex()
        wanted_ids = {id(functions[i]) for i in wanted}
        for action, which, attribute, value in steps:
            module = loaded[names[which]]
            if action == "bind":
                setattr(module, attribute, functions[value])
            elif action == "delete" and hasattr(module, attribute):
                delattr(module, attribute)
            elif action == "replace_module":
                loaded[names[which]] = types.ModuleType(names[which])
            cached = _ids(index.namespaces_binding(wanted_ids))
            assert cached == _ids(namespaces_binding_uncached(wanted_ids))
