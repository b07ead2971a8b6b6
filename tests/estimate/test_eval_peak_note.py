"""The evaluation-peak note (estimate/phase_notes.py `eval_peak_note`): where reserved memory
first reached its maximum after an "eval" mark, the evaluation set the peak, unless all it
added was one segment of the small-block pool (round 22b: minDiffusion's sampling loop after
batch-1024 training steps got a 2 MiB small segment, and the note blamed the evaluation for a
peak its training backward had set)."""

from peakmem.allocator.simulate import simulate
from peakmem.estimate.phase_notes import EVAL_PEAK, TRAIN_PEAK, eval_peak_note
from peakmem.trace.events import Trace

MiB = 2**20


def _train_then_eval(eval_bytes: int) -> Trace:
    t = Trace()
    t.mark("forward")
    big = t.alloc(100 * MiB)  # a large-pool segment of its own
    t.alloc(MiB)
    t.alloc(MiB)  # the two fill the first 2 MiB small-pool segment (kept alive)
    t.mark("backward")
    t.free(big)
    t.mark("step 1")
    t.mark("eval")
    t.alloc(eval_bytes)
    return t


def _note(trace: Trace, *, with_line: bool = True) -> str | None:
    result = simulate(trace, timeline=True)
    line = (lambda: result.timeline.reserved) if with_line else None
    return eval_peak_note(trace, result.peak_reserved_index, line, result.peak_allocated_index)


def test_an_evaluation_adding_one_small_segment_did_not_set_the_peak():
    trace = _train_then_eval(512)  # a new 2 MiB small segment: the reserved peak moves into eval
    result = simulate(trace, timeline=True)
    eval_mark = next(i for i, label in enumerate(trace.tag_ids) if trace.tag_of(i) is not None
                     and trace.tag_of(i).op == "eval")
    assert result.peak_reserved_index > eval_mark
    assert result.peak_reserved_bytes == 100 * MiB + 2 * 2 * MiB
    note = _note(trace)
    assert note == ("the peak was set during training: the evaluation after it added only "
                    "2.0 MiB of reserved memory (a segment of the small-block pool)")
    # without the reserved line (the old behaviour): blamed on the evaluation
    assert _note(trace, with_line=False) == EVAL_PEAK


def test_an_evaluation_adding_more_sets_the_peak():
    # 200 MiB: more than the cached 100 MiB block, a segment of its own
    assert _note(_train_then_eval(200 * MiB)) == EVAL_PEAK


def test_an_evaluation_fitting_in_cached_blocks_leaves_the_peak_to_training():
    t = Trace()
    t.mark("forward")
    t.alloc(100 * MiB)
    t.alloc(512)  # the first small segment, mostly free
    t.mark("step 1")
    t.mark("eval")
    t.alloc(512)  # fits in it: reserved memory never grows after the mark
    assert _note(t) == TRAIN_PEAK


def test_a_small_reserved_step_with_the_allocated_peak_in_the_evaluation_is_the_evaluation():
    # training's 100 MiB block is freed and cached; the evaluation's 99 MiB takes all of it
    # (the 1 MiB left is not split off), then small tensors need a new small segment: reserved
    # grows by 2 MiB only, but allocated memory peaks in the evaluation
    t = Trace()
    t.mark("forward")
    big = t.alloc(100 * MiB)
    t.alloc(MiB)
    t.alloc(MiB)
    t.mark("backward")
    t.free(big)
    t.mark("step 1")
    t.mark("eval")
    t.alloc(99 * MiB)  # reuses the cached block: no new reserved memory
    t.alloc(512)  # a new 2 MiB small segment: the reserved peak
    t.alloc(512 * 1024)  # in that segment: 102 MiB + 512.5 KiB allocated, above training's
    result = simulate(t, timeline=True)
    assert result.peak_allocated_index == len(t) - 1
    assert _note(t) == EVAL_PEAK
