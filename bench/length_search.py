"""Binary search for the longest sequence length whose probe succeeds (shared by the max-context benchmarks).

A probe maps a length to a status: ``ok``, or ``oom`` / ``killed`` (too long: the bracket shrinks), or anything
else (``error``, ``timeout``: a failure to fix, not a bound, so the search stops there).
"""

from __future__ import annotations

from collections.abc import Callable

TOO_LONG = ("oom", "killed")


def longest_ok(probe: Callable[[int], str], lo: int, hi: int, granularity: int, max_probes: int) -> dict:
    """Search multiples of ``granularity`` in ``[lo, hi]``; the lower end is probed first (it must fit, or the
    bracket means nothing). Returns ``{"longest_ok", "bracket", "stopped_on"}``."""
    a, b = -(-lo // granularity), hi // granularity  # in units of granularity, inside [lo, hi]
    if not 0 < a <= b:
        raise SystemExit(f"--search {lo} {hi}: no multiple of --granularity {granularity} in it")
    best, stopped = None, None
    status = probe(a * granularity)
    if status == "ok":
        best = a * granularity
        for _ in range(max_probes - 1):
            if b <= a:
                break
            mid = (a + b + 1) // 2
            status = probe(mid * granularity)
            if status == "ok":
                a, best = mid, mid * granularity
            elif status in TOO_LONG:
                b = mid - 1
            else:
                stopped = status
                break
    else:
        stopped = status
    return {"longest_ok": best, "bracket": [a * granularity, b * granularity] if best else None, "stopped_on": stopped}
