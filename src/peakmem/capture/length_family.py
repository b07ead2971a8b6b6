"""Growing-length no-grad forwards (issue 14): a generation loop feeds its model a sequence one
token longer each call (`generate`'s `model(idx)`), so no two calls share a replay key
(capture.repeated_forwards) and every forward ran op by op.

Such calls form a family: their keys are equal once every integer of the input signature (a
tensor's sizes and strides, an int argument) is abstracted. For a fake-mode forward every number
the capture records (each event's requested bytes, the outputs' sizes / strides / offsets, the
per-op costs' FLOPs and bytes) is, op by op, a polynomial of degree <= 2 in the sequence length
L (affine for most ops, quadratic for attention scores), while everything else (the events'
kinds and order, ids, streams, tags, dtypes, op names) stays the same. The allocator rounds the
requested bytes later (allocator/), so the raw sizes are the polynomials.

A family is fitted, never assumed: `OBSERVED` calls at distinct lengths are run for real; the
interpolating polynomial (degree <= 2, exact rational arithmetic) of the first three must
predict the fourth exactly, number for number, its skeleton (everything but the numbers) equal.
Then a later call of the family is predicted at its own L: replayed only when its input numbers
are the predicted ones and every predicted number is an integer where the observed ones were
(a float where they were floats), non-negative sizes. Every `RECHECK_EVERY`-th call of a fitted
family is run for real anyway and compared with its prediction (a mismatch drops the fit).

L: the first input number that differs between the first two observations.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

OBSERVED = 4
"""Calls at distinct lengths run for real before a family is replayed (3 fit, 1 checks)."""
RECHECK_EVERY = 16
"""Of a fitted family's calls, every this-many-th runs for real and is checked."""
MAX_FAMILIES = 8


class _Num:
    """A number's place in a skeleton (its type: int or float)."""

    __slots__ = ("kind",)

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Num) and other.kind is self.kind

    def __hash__(self) -> int:
        return hash(self.kind)

    def __repr__(self) -> str:
        return f"<{self.kind.__name__}>"


_INT, _FLOAT = _Num(int), _Num(float)


def flatten(value: Any, numbers: list) -> Any:
    """The skeleton of `value` (nested tuples / lists / dataclasses with every int and float
    replaced by a _Num), its numbers appended to `numbers` in order."""
    kind = type(value)
    if kind is int:
        numbers.append(value)
        return _INT
    if kind is float:
        numbers.append(value)
        return _FLOAT
    if kind is tuple or kind is list:
        return (kind, tuple(flatten(item, numbers) for item in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ("D", kind, tuple(flatten(getattr(value, f.name), numbers)
                                 for f in dataclasses.fields(value)))
    return ("V", value)


def rebuild(skeleton: Any, numbers: Any) -> Any:
    """`flatten`'s inverse: `numbers` an iterator."""
    if isinstance(skeleton, _Num):
        return next(numbers)
    head = skeleton[0]
    if head is tuple:
        return tuple(rebuild(item, numbers) for item in skeleton[1])
    if head is list:
        return [rebuild(item, numbers) for item in skeleton[1]]
    if head == "D":
        return skeleton[1](*(rebuild(item, numbers) for item in skeleton[2]))
    return skeleton[1]


@dataclasses.dataclass
class _Observation:
    length: int
    inputs: tuple  # the input signature's numbers
    numbers: list  # the window's numbers


@dataclasses.dataclass
class _Fit:
    lengths: tuple[int, int, int]
    constant: list  # per window number: its value where the three agree, else None
    varying: list[int]  # the window numbers' indices that vary
    values: list[tuple]  # per varying index: its three observed values
    inputs: list[tuple]  # per input number: its three observed values
    kinds: list[type]  # per varying index: int or float
    calls: int = 0


class Family:
    """Observed calls of one family and, once checked, their fit."""

    def __init__(self, skeleton: Any, input_skeleton: Any) -> None:
        self.skeleton = skeleton
        self.input_skeleton = input_skeleton
        self.observed: list[_Observation] = []
        self.position: int | None = None
        self.fit: _Fit | None = None
        self.unchecked = 0
        """Calls replayed since the last one run for real and compared."""

    # -- observing -----------------------------------------------------------------------------
    def observe(self, inputs: list, numbers: list) -> int:
        """A call run for real (its window's numbers); fits once `OBSERVED` calls agree. Returns
        how many replayed calls a failed check leaves in doubt (those since the last check)."""
        unchecked, self.unchecked = self.unchecked, 0
        if self.fit is not None:
            if self._predicts(inputs, numbers):
                return 0
            self.fit = None
            self.observed = []
            self._add(inputs, numbers)
            return unchecked
        self._add(inputs, numbers)
        return 0

    def _add(self, inputs: list, numbers: list) -> None:
        key = tuple(inputs)
        if any(o.inputs == key for o in self.observed):
            self.observed = []  # the same call again: not a growing length
        self.observed.append(_Observation(0, key, list(numbers)))
        if len(self.observed) > OBSERVED:
            self.observed.pop(0)
        if len(self.observed) < OBSERVED:
            return
        first, second = self.observed[0].inputs, self.observed[1].inputs
        position = next(i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
        for o in self.observed:
            o.length = o.inputs[position]
        if len({o.length for o in self.observed}) != OBSERVED:
            return
        self.position = position
        fit = _fit(self.observed[:3])
        if fit is None:
            return
        self.fit = fit
        last = self.observed[-1]
        if not self._predicts(list(last.inputs), last.numbers):
            self.fit = None

    def _predicts(self, inputs: list, numbers: list) -> bool:
        predicted = self.predict(inputs)
        return predicted is not None and predicted == numbers and all(
            type(a) is type(b) for a, b in zip(predicted, numbers, strict=True))

    def due_for_check(self) -> bool:
        fit = self.fit
        if fit is None:
            return True
        fit.calls += 1
        return fit.calls % RECHECK_EVERY == 0

    # -- predicting ----------------------------------------------------------------------------
    def predict(self, inputs: list) -> list | None:
        """The window's numbers at this call's length, or None where the call is no member."""
        fit = self.fit
        if fit is None or self.position is None:
            return None
        length = inputs[self.position]
        if type(length) is not int:
            return None
        weights = _weights(fit.lengths, length)
        for observed, value in zip(fit.inputs, inputs, strict=True):
            if _eval(weights, observed) != value:
                return None
        numbers = list(fit.constant)
        for index, kind, values in zip(fit.varying, fit.kinds, fit.values, strict=True):
            value = _eval(weights, values)
            if kind is int:
                if value.denominator != 1:
                    return None
                numbers[index] = int(value)
            else:
                numbers[index] = float(value)
        return numbers


def _fit(observed: list[_Observation]) -> _Fit | None:
    lengths = tuple(o.length for o in observed)
    if len(set(lengths)) != 3 or not all(type(x) is int for x in lengths):
        return None
    constant: list = []
    varying: list[int] = []
    values: list[tuple] = []
    kinds: list[type] = []
    columns = zip(*(o.numbers for o in observed), strict=True)
    for index, column in enumerate(columns):
        kind = type(column[0])
        if any(type(v) is not kind for v in column):
            return None
        if column[0] == column[1] == column[2]:
            constant.append(column[0])
            continue
        constant.append(None)
        varying.append(index)
        values.append(tuple(Fraction(v) for v in column))
        kinds.append(kind)
    inputs = [tuple(Fraction(v) for v in column)
              for column in zip(*(o.inputs for o in observed), strict=True)]
    return _Fit(lengths, constant, varying, values, inputs, kinds)  # type: ignore[arg-type]


def _weights(points: tuple[int, int, int], x: int) -> tuple[Fraction, Fraction, Fraction]:
    """Lagrange's basis at x for three points."""
    a, b, c = points
    return (Fraction((x - b) * (x - c), (a - b) * (a - c)),
            Fraction((x - a) * (x - c), (b - a) * (b - c)),
            Fraction((x - a) * (x - b), (c - a) * (c - b)))


def _eval(weights: tuple, values: tuple) -> Fraction:
    if values[0] == values[1] == values[2]:
        return values[0]
    return weights[0] * values[0] + weights[1] * values[1] + weights[2] * values[2]
