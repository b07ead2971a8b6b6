"""The grid's batch split: how well the workspace table's fallback answers a batch past the
largest one it measured (the zoo's ResNet-50 at batch 128 / 256 against a grid that stops at 64).

Declared split (measurement data only, never the zoo's groundtruth rows):
- choose: the table's cuDNN cases with n <= 16 answer the n = 32 cases (FIT_SPLIT);
- evaluate: the cases with n <= 32 answer the n = 64 cases (TEST_SPLIT).
An extrapolation rule replaces today's fallback only if it is better on the evaluation split.

A candidate is `(quantile, batch_exponent)` of `WorkspaceTable.nearest`: today's is (0.5, 0.0),
the weighted median ratio of workspace per byte of x + y + w, which is linear in the batch. What
the grid says about the scaling itself (`pair_exponents`): for the same layer measured at two
batches n1 < n2 <= 32, log(ratio2 / ratio1) / log(n2 / n1) has a median of 0.00 forward and
backward-data and -0.06 backward-weight: the workspace grows like x + y + w, as the fallback has it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from peakmem.profiles.conv_workspace_table import WorkspaceTable

SCORED = ("forward", "backward_data", "backward_weight")
FIT_SPLIT = (16, 32)  # (largest batch kept in the table, batch answered)
TEST_SPLIT = (32, 64)
UNDER_TOLERANCE = 0.01  # an answer is "under" below truth - 1% of x + y + w


@dataclass(frozen=True)
class SplitScore:
    """Per direction over a split's cases: |error| / (x + y + w) median and p90, the share of
    answers under, and the bytes under / over summed over the cases."""

    direction: str
    cases: int
    median: float
    p90: float
    share_under: float
    under_bytes: int
    over_bytes: int


def score_split(table: WorkspaceTable, split: tuple[int, int], quantile: float = 0.5,
                batch_exponent: float = 0.0) -> list[SplitScore]:
    kept, asked = split
    trained = table.without(lambda case: case.shape.n <= kept)
    targets = [c for c in table.cases if c.shape.n == asked and c.backend == "Cudnn"]
    scores = []
    for direction in SCORED:
        effects, under, under_bytes, over_bytes = [], 0, 0, 0
        for case in targets:
            if direction not in case.bytes:
                continue
            truth = case.bytes[direction]
            guess = trained.nearest(case.shape, direction, quantile, batch_exponent)
            effects.append(abs(guess - truth) / case.shape.tensor_bytes)
            under += truth - guess > UNDER_TOLERANCE * case.shape.tensor_bytes
            under_bytes += max(0, truth - guess)
            over_bytes += max(0, guess - truth)
        effects.sort()
        scores.append(SplitScore(direction, len(effects), statistics.median(effects),
                                 effects[min(len(effects) - 1, int(0.9 * len(effects)))],
                                 under / len(effects), under_bytes, over_bytes))
    return scores


def worst_under(table: WorkspaceTable, split: tuple[int, int], count: int) -> list[tuple]:
    """The `count` answers of the split furthest under (today's fallback): (bytes under,
    direction, shape, measured / (x + y + w), answered / (x + y + w)), and the share of all the
    bytes under they make."""
    kept, asked = split
    trained = table.without(lambda case: case.shape.n <= kept)
    rows = []
    for case in table.cases:
        if case.shape.n != asked or case.backend != "Cudnn":
            continue
        for direction in SCORED:
            if direction in case.bytes:
                truth, guess = case.bytes[direction], trained.nearest(case.shape, direction)
                rows.append((truth - guess, direction, case.shape, truth / case.shape.tensor_bytes,
                             guess / case.shape.tensor_bytes))
    rows.sort(key=lambda row: -row[0])
    total = sum(max(0, row[0]) for row in rows)
    return [(*row, row[0] / total) for row in rows[:count]]


def pair_exponents(table: WorkspaceTable, largest: int = FIT_SPLIT[1]) -> dict[str, float]:
    """direction -> the median over same-layer pairs (n1 < n2 <= largest, both workspaces > 0)
    of log(ratio2 / ratio1) / log(n2 / n1), ratio = workspace / (x + y + w)."""
    layers: dict[tuple, dict] = defaultdict(dict)
    for case in table.cases:
        if case.backend == "Cudnn" and case.shape.n <= largest:
            layers[case.shape.key[1:]][case.shape.n] = case
    out = {}
    for direction in SCORED:
        values = []
        for by_n in layers.values():
            ns = sorted(by_n)
            for i, n1 in enumerate(ns):
                for n2 in ns[i + 1:]:
                    a, b = by_n[n1], by_n[n2]
                    wa, wb = a.bytes.get(direction), b.bytes.get(direction)
                    if wa and wb:
                        values.append(math.log((wb / b.shape.tensor_bytes) / (wa / a.shape.tensor_bytes))
                                      / math.log(n2 / n1))
        out[direction] = statistics.median(values)
    return out
