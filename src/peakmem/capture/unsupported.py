"""What peakmem cannot capture yet: the job stops with one clear line naming it."""

from __future__ import annotations


class Unsupported(Exception):  # noqa: N818  (reads as "peakmem.capture.Unsupported")
    """The job needs `what`, which peakmem does not support yet. The CLI maps it to the error
    kind `unsupported` (exit code 3)."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"peakmem does not support {what} yet")
