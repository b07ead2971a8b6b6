"""A job's compiler-config settings are put back after the capture (capture.compiled_code)."""

import torch._dynamo.config as dynamo_config
import torch._inductor.config as inductor_config

from peakmem.capture.compiled_code import _still_equal, compiler_configs_restored


def test_settings_set_or_mutated_inside_are_put_back():
    limit = dynamo_config.recompile_limit
    banned = list(dynamo_config._autograd_backward_strict_mode_banned_ops)
    subclasses = set(dynamo_config.traceable_tensor_subclasses)
    untouched = dynamo_config.get_config_copy()
    with compiler_configs_restored():
        dynamo_config.recompile_limit = limit + 56
        dynamo_config._autograd_backward_strict_mode_banned_ops.append("peakmem_test_op")
        dynamo_config.traceable_tensor_subclasses.add(int)  # mutated in place
        inductor_config.max_autotune = not inductor_config.max_autotune
        flipped = inductor_config.max_autotune
    assert dynamo_config.recompile_limit == limit
    assert dynamo_config._autograd_backward_strict_mode_banned_ops == banned
    assert dynamo_config.traceable_tensor_subclasses == subclasses
    assert inductor_config.max_autotune is (not flipped)
    assert dynamo_config.get_config_copy() == untouched


def test_an_uncomparable_setting_is_left_to_getattr():
    class Odd:
        def __eq__(self, other):
            raise TypeError("no comparison")

    assert not _still_equal({"k": Odd()}, "k", 1)
    assert not _still_equal({}, "k", 1)
    assert not _still_equal({"k": float("nan")}, "k", float("nan"))
    assert _still_equal({"k": [1, 2]}, "k", [1, 2])
