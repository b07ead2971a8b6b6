"""The leading numbers of a release string, shared by every reader of one (torch's in the SDPA
rule, transformers' in capture.hf_release): `2.11.0+cu130` -> (2, 11, 0), `5.20.0.dev0` ->
(5, 20, 0), `4.51.3rc1` -> (4, 51, 3), `2.5` -> (2, 5). Torch-free: the estimate's parent reads
releases too."""

from __future__ import annotations


def leading_numbers(text: str) -> tuple[int, ...]:
    """The dot-separated numbers `text` starts with, up to the first piece that is not all
    digits (that piece's leading digits included); () when it starts with no number."""
    parts: list[int] = []
    for piece in text.strip().split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts)
