"""The torch.compile note names only compiled code that ran: libraries compile helpers at import
(DeepSpeed's Muon: `zeropower_via_newtonschulz5`, ...) that most jobs never call."""

import torch

from peakmem.capture import capture_callable


def _compile_notes(result) -> list[str]:
    return [note for note in result.notes if note.startswith("torch.compile was not applied")]


def test_a_compiled_function_never_called_is_not_named(a100, stack24):
    def job():
        @torch.compile(mode="max-autotune")
        def never_called(x):
            return x * 2

        @torch.compile
        def called(x):
            return x + 1

        model = torch.nn.Linear(8, 8).cuda()
        called(model(torch.randn(4, 8, device="cuda"))).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    notes = _compile_notes(result)
    assert len(notes) == 1
    assert notes[0].startswith("torch.compile was not applied: test_a_compiled_function_never_"
                               "called_is_not_named.<locals>.job.<locals>.called ran eagerly;")
    assert "job.<locals>.never_called" not in notes[0] and "max-autotune" not in notes[0]


def test_no_note_when_nothing_compiled_ran(a100, stack24):
    def job():
        unused = torch.compile(torch.nn.Linear(8, 8).cuda())  # noqa: F841
        model = torch.nn.Linear(8, 8).cuda()
        model(torch.randn(4, 8, device="cuda")).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert _compile_notes(result) == []
