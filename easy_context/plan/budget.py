"""The byte budget of one training step: :class:`Term` (bytes as a function of the tokens on one rank) and the
:class:`Budget` that holds the terms of every phase (:func:`~easy_context.plan.terms.build_budget` makes one). What
each term counts: docs/planner.md."""

from __future__ import annotations

import math
from dataclasses import dataclass

from easy_context.core.layout import Layout
from easy_context.plan.options import MemOption


@dataclass
class Term:
    """``fixed + per_token * s`` bytes, s = tokens on one rank."""

    name: str
    fixed: float = 0.0
    per_token: float = 0.0

    def at(self, s: float) -> float:
        return self.fixed + self.per_token * s


@dataclass
class Budget:
    """All terms of one (mode, configuration): GPU persistent + phases, host always + host phases; see :meth:`at`."""

    layout: Layout
    option: MemOption
    gpu_reserve: list[Term]  # outside the caching allocator (not fragmented)
    gpu_persistent: list[Term]
    phases: dict[str, list[Term]]
    host: list[Term]  # alive the whole step
    host_phases: dict[str, list[Term]]  # alive in one part of the step only (the host peak is in one of them)
    frag: float
    pinned_pow2_tensors: int = 0  # host checkpoint tensors of s*h*2 B each (power-of-two rounded)
    pinned_tensor_per_token: float = 0.0
    offload_layers: int = 0  # layer inputs held in host memory, per process (the first ones; the others on GPU)
    layers: int = 0  # checkpointed layer inputs (the layer count unless checkpoint_every > 1)

    def gpu_phase_totals(self, s: float) -> dict[str, float]:
        base = sum(t.at(s) for t in self.gpu_persistent)
        reserve = sum(t.at(s) for t in self.gpu_reserve)
        return {p: reserve + (1 + self.frag) * (base + sum(t.at(s) for t in terms)) for p, terms in self.phases.items()}

    def host_phase_components(self, s: float) -> dict[str, list[tuple[str, float]]]:
        """Per host phase: the components alive in it (the always-alive ones first)."""
        common = [(t.name, t.at(s)) for t in self.host]
        out = {}
        for name, terms in self.host_phases.items():
            comps = []
            for t in terms:
                b = t.at(s)
                if t.name.startswith("offloaded checkpoints") and self.pinned_pow2_tensors and s > 0:
                    b = self.pinned_pow2_tensors * 2 ** math.ceil(math.log2(self.pinned_tensor_per_token * s))
                comps.append((t.name, b))
            out[name] = common + comps
        return out

    def host_components(self, s: float) -> list[tuple[str, float]]:
        """The host components of the host's peak phase."""
        phases = self.host_phase_components(s)
        return phases[max(phases, key=lambda p: sum(b for _, b in phases[p]))]

    def at(self, seq: int) -> dict:
        """The breakdown at full sequence length ``seq``: GPU components of the peak phase, host components of the
        host's peak phase; ``gpu_allocated`` is the caching allocator's share before fragmentation."""
        s = seq / self.layout.shard
        totals = self.gpu_phase_totals(s)
        peak = max(totals, key=totals.get)
        comps = [(t.name, t.at(s)) for t in self.gpu_persistent] + [(t.name, t.at(s)) for t in self.phases[peak]]
        alloc = sum(b for _, b in comps)
        comps.append((f"allocator fragmentation ({self.frag:.0%})", self.frag * alloc))
        comps += [(t.name, t.at(s)) for t in self.gpu_reserve]
        hphases = self.host_phase_components(s)
        htotals = {p: sum(b for _, b in c) for p, c in hphases.items()}
        hpeak = max(htotals, key=htotals.get)
        return dict(
            seq=seq,
            local_tokens=s,
            offload_layers=self.offload_layers,
            peak_phase=peak,
            phase_totals=totals,
            gpu=comps,
            gpu_allocated=alloc,
            gpu_total=sum(b for _, b in comps),
            host=hphases[hpeak],
            host_peak_phase=hpeak,
            host_phase_totals=htotals,
            host_total=htotals[hpeak],
        )
