"""The largest value of one integer script argument whose estimate fits a GPU (`peakmem fit`).

Peak memory grows near-linearly with a batch size or a sequence length, so a line through two
estimates predicts the answer; the prediction and its neighbour are then checked with real
estimates, and where the line was off the bracket [largest fitting, smallest not fitting] is
narrowed by new secants (bisection after a few misses) until the two are adjacent. Each probe
is one `measure(value)` call (an estimate); results are cached per value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

_SPEC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")
MAX_SECANT_MISSES = 3


class FitSpecError(ValueError):
    """A bad `--arg NAME=LOW..HIGH` or a command without its `{NAME}` placeholder."""


@dataclass(frozen=True)
class ArgRange:
    """`--arg batch_size=1..4096`: the knob's name and its inclusive integer range."""

    name: str
    low: int
    high: int

    @property
    def placeholder(self) -> str:
        return "{" + self.name + "}"

    def command_for(self, command: Sequence[str], value: int) -> list[str]:
        """The command with every `{name}` replaced by `value`."""
        return [part.replace(self.placeholder, str(value)) for part in command]

    def check_command(self, command: Sequence[str]) -> None:
        if not any(self.placeholder in part for part in command):
            raise FitSpecError(
                f"the command has no {self.placeholder} placeholder: write it where the value "
                f"goes, e.g. -- python train.py --{self.name.replace('_', '-')} {self.placeholder}"
            )


def parse_arg_range(text: str) -> ArgRange:
    """'batch_size=1..4096' -> ArgRange; FitSpecError for anything else."""
    match = _SPEC.match(text or "") if len(text or "") <= 200 else None
    shown = repr(text if len(text or "") <= 80 else text[:77] + "...")
    if match is None:
        raise FitSpecError(
            f"--arg {shown} is not NAME=LOW..HIGH (e.g. batch_size=1..4096; NAME is a Python "
            "identifier, LOW and HIGH integers)"
        )
    name, low, high = match.group(1), int(match.group(2)), int(match.group(3))
    if low < 1:
        raise FitSpecError(f"--arg {shown}: LOW must be at least 1")
    if high < low:
        raise FitSpecError(f"--arg {shown}: HIGH ({high}) is below LOW ({low})")
    if high > MAX_HIGH:  # 10**100: hundreds of estimates of values no tensor can have
        raise FitSpecError(f"--arg {shown}: HIGH must be at most {MAX_HIGH} (2**63 - 1, the "
                           "largest tensor dimension)")
    return ArgRange(name, low, high)


MAX_HIGH = 2**63 - 1


@dataclass
class Probe:
    """One estimate: the value, its peak with the safety margin, whether it fits."""

    value: int
    peak_bytes_with_margin: int
    fits: bool


@dataclass
class FitAnswer:
    """The largest fitting value (None when even the lowest does not fit) and the value above
    it (None at the top of the range), each with its estimated peak."""

    gpu: str
    capacity_bytes: int
    value: int | None
    peak_bytes_with_margin: int | None
    next_value: int | None
    next_peak_bytes_with_margin: int | None
    probes: list[Probe] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "value": self.value,
            "peak_bytes_with_margin": self.peak_bytes_with_margin,
            "next_value": self.next_value,
            "next_peak_bytes_with_margin": self.next_peak_bytes_with_margin,
        }


Measure = Callable[[int], Probe]


def _secant(points: list[Probe], capacity: int, slope_hint: float | None) -> float | None:
    """The value where the line through the probes nearest the capacity crosses it."""
    by_value = sorted(points, key=lambda p: p.value)
    if len(by_value) >= 2:
        below = [p for p in by_value if p.peak_bytes_with_margin <= capacity]
        above = [p for p in by_value if p.peak_bytes_with_margin > capacity]
        if below and above:
            a, b = below[-1], above[0]
        elif below:
            a, b = below[-2] if len(below) > 1 else below[-1], below[-1]
        else:
            a, b = above[0], above[1] if len(above) > 1 else above[0]
        if a.value != b.value:
            slope = (b.peak_bytes_with_margin - a.peak_bytes_with_margin) / (b.value - a.value)
            if slope > 0:
                return a.value + (capacity - a.peak_bytes_with_margin) / slope
            return None if below and not above else a.value
    if points and slope_hint and slope_hint > 0:
        a = by_value[0]
        return a.value + (capacity - a.peak_bytes_with_margin) / slope_hint
    return None


def _midpoint(fit_at: int, fail_at: int) -> int:
    """The bisection's next value: the geometric mean while the bracket spans more than a
    factor of four (`--arg b=1..2**63-1`: halving the width took 60 steps to come down from
    2^63 to the answer's magnitude, the geometric mean takes 6), the arithmetic one then."""
    if fit_at >= 1 and fail_at > 4 * fit_at:
        return min(max(math.isqrt(fit_at * fail_at), fit_at + 1), fail_at - 1)
    return (fit_at + fail_at) // 2


def slope_of(probes: Sequence[Probe]) -> float | None:
    """Bytes per unit of the knob, from the lowest and highest probe (None with fewer than two)."""
    ordered = sorted(probes, key=lambda p: p.value)
    if len(ordered) < 2 or ordered[0].value == ordered[-1].value:
        return None
    first, last = ordered[0], ordered[-1]
    return (last.peak_bytes_with_margin - first.peak_bytes_with_margin) / (last.value - first.value)


def find_largest(
    measure: Measure,
    low: int,
    high: int,
    capacity_bytes: int,
    gpu: str,
    *,
    slope_hint: float | None = None,
) -> FitAnswer:
    """The largest value in [low, high] whose probe fits, assuming fitting is monotone in the
    value (a larger batch never needs less memory)."""
    cache: dict[int, Probe] = {}

    def probe(value: int) -> Probe:
        if value not in cache:
            cache[value] = measure(value)
        return cache[value]

    def answer(value: int | None) -> FitAnswer:
        nxt = low if value is None else (value + 1 if value < high else None)
        return FitAnswer(
            gpu=gpu,
            capacity_bytes=capacity_bytes,
            value=value,
            peak_bytes_with_margin=None if value is None else cache[value].peak_bytes_with_margin,
            next_value=nxt,
            next_peak_bytes_with_margin=None if nxt is None else cache[nxt].peak_bytes_with_margin,
            probes=[cache[v] for v in sorted(cache)],
        )

    if not probe(low).fits:
        return answer(None)
    fit_at, fail_at = low, high + 1  # the bracket: fit_at fits, fail_at does not (or is beyond)
    if slope_hint is None and high > low:
        # a second point far enough from the first for the line to mean something
        second = min(high, max(low + 1, low * 4))
        if probe(second).fits:
            fit_at = second
        else:
            fail_at = second
    misses = 0
    tried_top = False
    bisect_next = False
    while fail_at - fit_at > 1:
        width = fail_at - fit_at
        crossing = None
        use_secant = misses < MAX_SECANT_MISSES and not bisect_next
        if use_secant:
            crossing = _secant(list(cache.values()), capacity_bytes, slope_hint)
        if use_secant and crossing is None and not tried_top:
            candidate = fail_at - 1  # flat so far: the top of the bracket may fit
            tried_top = True
        elif crossing is None:
            candidate = _midpoint(fit_at, fail_at)
        else:
            candidate = min(max(int(crossing), fit_at + 1), fail_at - 1)
        predicted = crossing is not None  # a bisection's neighbour tells nothing new
        if probe(candidate).fits:
            fit_at = candidate
            if predicted and candidate + 1 < fail_at:  # its neighbour
                if probe(candidate + 1).fits:
                    fit_at = candidate + 1
                    misses += 1
                else:
                    fail_at = candidate + 1
        else:
            fail_at = candidate
            if predicted and candidate - 1 > fit_at:
                if probe(candidate - 1).fits:
                    fit_at = candidate - 1
                else:
                    fail_at = candidate - 1
                    misses += 1
        # a secant step that did not halve the bracket (a curved peak): bisect once
        bisect_next = crossing is not None and (fail_at - fit_at) * 2 > width
    if fail_at <= high:
        probe(fail_at)
    return answer(fit_at)


def fit_command(
    command: Sequence[str],
    knob: ArgRange,
    gpus: Sequence[object],
    *,
    on_probe: Callable[[str, int, int], None] | None = None,
    **estimate_kwargs: object,
) -> list[FitAnswer]:
    """`find_largest` for each GPU profile, each probe one `estimate_command` of the command with
    the knob's placeholder filled in (keyword arguments go to it). The slope found on one GPU
    seeds the next one's search. `on_probe(gpu, value, n)` is told of each estimate.
    EstimateError of a probe propagates, its message prefixed with the value."""
    from peakmem.estimate.api import EstimateError, estimate_command

    knob.check_command(command)
    answers: list[FitAnswer] = []
    count = 0
    slope_hint: float | None = None
    for gpu in gpus:
        name = str(getattr(gpu, "name", gpu))

        def measure(value: int, gpu: object = gpu, name: str = name) -> Probe:
            nonlocal count
            count += 1
            if on_probe is not None:
                on_probe(name, value, count)
            try:
                result = estimate_command(knob.command_for(command, value), gpu=gpu,
                                          **estimate_kwargs)  # type: ignore[arg-type]
            except EstimateError as exc:
                exc.message = f"at {knob.name}={value} on {name}: {exc.message}"
                raise
            fits = result.fits and result.peak_bytes_with_margin <= result.capacity_bytes
            return Probe(value, result.peak_bytes_with_margin, fits)

        capacity = int(getattr(gpu, "total_memory_bytes", 0)) or _capacity_of(name)
        answer = find_largest(measure, knob.low, knob.high, capacity, name, slope_hint=slope_hint)
        slope_hint = slope_of(answer.probes) or slope_hint
        answers.append(answer)
    return answers


def _capacity_of(name: str) -> int:
    from peakmem.profiles import load_gpu

    return load_gpu(name).total_memory_bytes
