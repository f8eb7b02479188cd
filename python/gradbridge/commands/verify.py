"""`gradbridge verify`: the self-check of the installed torch (``gradbridge.verify``): one line per
group, the verdict recorded for this torch build; exit code 1 when a case differs."""

from __future__ import annotations

from typing import Callable


def run(out: Callable[[str], None] = print) -> int:
    from ..verify import run as verify

    return 0 if verify(out).passed else 1
