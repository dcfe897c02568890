"""What the GPU checks (tests/gpu/check_*.py) share: relative error, one PASS/FAIL line per check, and running groups
of checks so that one failing group still lets the others report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference over the largest reference entry (float64)."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


class Report:
    def __init__(self) -> None:
        self.results: list[dict] = []

    def record(self, name: str, ok: bool, required: bool = True, **info) -> None:
        self.results.append(dict(name=name, ok=bool(ok), required=required, **info))
        detail = " ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in info.items())
        print(f"{'PASS' if ok else 'FAIL'}{'' if required else ' (info)'} {name}: {detail}", flush=True)

    def run(self, groups: dict[str, Callable[[], object]], json_path: str | None) -> int:
        """Run every group; exit status 0 only when every required check passed."""
        for name, check in groups.items():
            try:
                check()
            except Exception as exc:  # one failing group still lets the others report
                self.record(f"exception/{name}", False, error=f"{type(exc).__name__}: {exc}"[:600])
        failed = [r["name"] for r in self.results if r["required"] and not r["ok"]]
        print(f"{len(self.results)} checks, {len(failed)} required failed: {failed}", flush=True)
        if json_path:
            Path(json_path).write_text(json.dumps(self.results, indent=1))
        return 1 if failed else 0
