"""A frozen teacher's no-grad forward on the batch the job holds is part of the training step,
also on an epoch's last batch read through a loader that fetches one batch ahead (accelerate's
DataLoaderShard, so every HF Trainer job): its look-ahead `next()` has met the epoch's end
before the job gets that batch (capture/dataloader.py `LoaderIteration.fetches_ahead`). Round
22a: TRL's DistillationTrainer with two batches an epoch reported an evaluation mid-training."""

from __future__ import annotations

import textwrap

from peakmem.estimate import estimate_command

GPU = {"gpu": "a100-40gb", "torch_version": "2.4.1"}

JOB = """
    import torch

    def ahead(loader):
        # yields each batch once the next one is fetched, as accelerate's DataLoaderShard does
        batches = iter(loader)
        current = next(batches)
        for following in batches:
            yield current
            current = following
        yield current

    torch.manual_seed(0)
    teacher = torch.nn.Sequential(
        torch.nn.Linear(64, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda().eval()
    student = torch.nn.Linear(64, 10).cuda()
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 64)), batch_size=16)
    for epoch in range(3):
        for x, in BATCHES:
            x = x.cuda()
            with torch.no_grad():
                soft = torch.softmax(teacher(x), dim=-1)
            loss = torch.nn.functional.cross_entropy(student(x), soft)
            loss.backward()
            opt.step()
            opt.zero_grad()
    student.eval()  # an evaluation after training (no DataLoader): still one
    with torch.no_grad():
        student(torch.randn(4, 64).cuda())
"""


def _phases(tmp_path, batches: str) -> list[str]:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(JOB).replace("BATCHES", batches))
    result = estimate_command(["python", str(path)], **GPU)
    assert result.estimate_kind == "training"
    return result.capture.trace.meta["phases_ran"]


def test_teacher_on_the_last_batch_of_a_read_ahead_epoch_is_training(tmp_path):
    # before: ["training", "eval", "training", "eval", "training", "eval"]: the teacher's
    # forward on each epoch's last batch read as an evaluation (that epoch had finished); the
    # evaluation after training is one still
    assert _phases(tmp_path, "ahead(loader)") == ["training", "eval"]


def test_a_plain_loop_holds_its_last_batch_before_the_epoch_ends(tmp_path):
    assert _phases(tmp_path, "loader") == ["training", "eval"]


TWO_OPTIMIZERS = """
    import torch

    encoder, decoder = torch.nn.Linear(64, 64).cuda(), torch.nn.Linear(64, 10).cuda()
    opt_enc = torch.optim.Adam(encoder.parameters())
    opt_dec = torch.optim.Adam(decoder.parameters())
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(48, 64)), batch_size=16)
    for epoch in range(3):
        for x, in loader:
            decoder(encoder(x.cuda())).sum().backward()
            opt_enc.step()
            opt_dec.step()
            opt_enc.zero_grad()
            opt_dec.zero_grad()
    with torch.no_grad():
        decoder(encoder(torch.randn(4, 64).cuda()))
"""


def test_two_optimizers_stepping_on_each_batch_are_not_a_read_ahead(tmp_path):
    # r2's seq2seq (an encoder's and a decoder's Adam): each batch's position recorded twice
    # read as a window of 0 and the first step "one batch after it": the evaluation after
    # training was taken for part of a training step
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(TWO_OPTIMIZERS))
    result = estimate_command(["python", str(path)], **GPU)
    assert result.capture.trace.meta["phases_ran"] == ["training", "eval"]
