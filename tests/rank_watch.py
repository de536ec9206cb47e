"""How the multi-process tests wait for their ranks, whether started fresh (tests/distributed.py)
or forked (tests/rank_zygote.py): one loop, so that both fail the same way."""

from __future__ import annotations

import time
from collections.abc import Callable


def watch(poll: Callable[[int], int | None], kill: Callable[[int], None], world: int, timeout: float) -> str | None:
    """Wait for ranks 0 .. world-1 (``poll(r)``: rank r's exit code, None while it runs; ``kill(r)``:
    kill rank r and reap it).  None when all exit 0, else why not: as soon as one rank fails, the
    others are killed a second later (time to print their side); at ``timeout`` all are."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [poll(r) for r in range(world)]
        failed = any(c not in (None, 0) for c in codes)
        if None not in codes:
            return "a rank failed" if failed else None
        if failed or time.monotonic() > deadline:
            if failed:
                time.sleep(1)
            for r in range(world):
                kill(r)
            return "a rank failed" if failed else f"timed out after {timeout:.0f} s"
        time.sleep(0.05)
