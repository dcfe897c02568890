"""The solve: the longest full sequence S whose step fits GPU and host memory, per SP mode x memory option."""

from __future__ import annotations

import math
from dataclasses import dataclass

from easy_context.core import registry
from easy_context.models.shapes import ModelShape
from easy_context.plan.budget import Budget
from easy_context.plan.options import OPTIONS, MemOption, allowed_configs
from easy_context.plan.setup import Setup, mode_layout
from easy_context.plan.terms import build_budget

MODES = registry.SEQ_ALGOS  # the built-in backends; the planner takes every registered one (registry.SEQ_ALGOS)
ROUND_TOKENS = 1024


@dataclass
class Prediction:
    """The longest S of one mode x memory option, what bounds it, and the configuration reaching it."""

    mode: str
    option: str
    max_seq: int
    limited_by: str  # "gpu:<phase>", "host", or "infeasible"
    reason: str | None = None
    local_tokens: int = 0
    ring_degree: int | None = None
    config: str = ""  # the concrete configuration reaching max_seq (a subset of the option's features)
    offload_layers: int | None = None  # offload-split: layer inputs on the host at max_seq (the others on GPU)


def _fits_host(b: Budget, seq: int, host_mem: float) -> bool:
    """Whether the host peak at full length ``seq`` (pinned blocks rounded as allocated) fits ``host_mem``."""
    return sum(x for _, x in b.host_components(seq / b.layout.shard)) <= host_mem


def _solve(b: Budget, setup: Setup) -> tuple[float, str]:
    """The longest local length s (unrounded) with every GPU phase and every host phase within its memory, and
    the bound reaching it; a negative s when the fixed bytes alone do not fit."""
    usable = (setup.gpu_mem - sum(t.fixed for t in b.gpu_reserve)) / (1 + b.frag)
    pf = sum(t.fixed for t in b.gpu_persistent)
    pt = sum(t.per_token for t in b.gpu_persistent)
    limits: dict[str, float] = {}
    for name, terms in b.phases.items():
        fixed, slope = pf + sum(t.fixed for t in terms), pt + sum(t.per_token for t in terms)
        if fixed > usable:
            limits[f"gpu:{name}"] = -1.0
        elif slope > 0:
            limits[f"gpu:{name}"] = (usable - fixed) / slope
    hf0, hs0 = sum(t.fixed for t in b.host), sum(t.per_token for t in b.host)
    for terms in b.host_phases.values():
        hf, hs = hf0 + sum(t.fixed for t in terms), hs0 + sum(t.per_token for t in terms)
        if hf > setup.host_mem:
            limits["host"] = -1.0
        elif hs > 0:
            limits["host"] = min(limits.get("host", math.inf), (setup.host_mem - hf) / hs)
    bound = min(limits, key=limits.get)
    return limits[bound], bound


def split_offload_layers(shape: ModelShape, setup: Setup, mode: str, option: MemOption, seq: int) -> int:
    """``offload-split``: how many layer inputs the host holds at length ``seq`` next to everything else it holds
    in the forward/backward (what ``bench/max_context.py --offload-layers auto`` does, with this planner's host
    terms instead of MemAvailable)."""
    b = build_budget(shape, setup, mode, option, offload_layers=0)
    s = seq / b.layout.shard
    if s <= 0:
        return setup.stored_inputs(shape.layers)
    fixed = sum(t.at(s) for t in b.host) + sum(t.at(s) for t in b.host_phases["forward/backward"])
    per_layer = setup.procs_per_node * 2 * shape.hidden * s
    return max(0, min(setup.stored_inputs(shape.layers), int((setup.host_mem - fixed) // per_layer)))


def budget_at(shape: ModelShape, setup: Setup, mode: str, option: MemOption, seq: int,
              offload_layers: int | None = None) -> Budget:  # fmt: skip
    """:func:`build_budget` for a length ``seq``: ``offload-split`` offloads ``offload_layers`` layer inputs, by
    default as many as the host holds at ``seq`` (:func:`split_offload_layers`)."""
    if option.checkpointing == "offload-split" and offload_layers is None:
        offload_layers = split_offload_layers(shape, setup, mode, option, seq)
    return build_budget(shape, setup, mode, option, offload_layers)


def predict(shape: ModelShape, setup: Setup, mode: str, option: MemOption) -> Prediction:
    """Longest S with GPU bytes <= gpu_mem on every phase and host bytes <= host_mem (docs/planner.md).

    ``offload-split``: for each number k of offloaded layer inputs the bytes are linear in s; the longest S is the
    best over k = L .. 0 (the host full, each further token costs the L - k resident layer inputs on the GPU)."""
    lay = mode_layout(mode, shape, setup)
    rd = lay.options.get("ring_degree")
    if lay.infeasible:
        return Prediction(mode, option.name, 0, "infeasible", lay.infeasible, ring_degree=rd)
    split = option.checkpointing == "offload-split"
    ks = range(setup.stored_inputs(shape.layers), -1, -1) if split else [None]
    budgets = [build_budget(shape, setup, mode, option, k) for k in ks]
    solved = [_solve(b, setup) for b in budgets]
    j = max(range(len(solved)), key=lambda n: solved[n][0])  # ties: the first (most offloaded)
    (s_max, bound), b = solved[j], budgets[j]
    if s_max < 0:
        what = "GPU" if bound.startswith("gpu") else "host"
        return Prediction(mode, option.name, 0, "infeasible", f"model states alone exceed {what} memory ({bound})",
                          ring_degree=rd)  # fmt: skip
    step = math.lcm(lay.multiple, ROUND_TOKENS)
    n = int(s_max * lay.shard // step)
    if b.pinned_pow2_tensors and n > 0 and not _fits_host(b, n * step, setup.host_mem):
        lo, hi = 0, n  # power-of-two rounding of pinned blocks: largest n that fits (monotone)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if _fits_host(b, mid * step, setup.host_mem) else (lo, mid - 1)
        n, bound = lo, "host"
    seq = n * step
    k_at = None
    if split:  # at seq the host holds at least the k solved for; report the GPU phase that bounds it then
        k_at = split_offload_layers(shape, setup, mode, option, seq) if seq else b.offload_layers
        if seq:
            bound = "gpu:" + build_budget(shape, setup, mode, option, k_at).at(seq)["peak_phase"]
    return Prediction(mode, option.name, seq, bound, None if seq else "less than one rounding step fits",
                      local_tokens=seq // lay.shard, ring_degree=rd, config=option.name,
                      offload_layers=k_at)  # fmt: skip


def best_prediction(shape: ModelShape, setup: Setup, mode: str, option: MemOption) -> Prediction:
    """The longest S over the configurations ``option`` allows (:func:`allowed_configs`); ties keep the full set."""
    best = None
    for cfg in allowed_configs(option):
        p = predict(shape, setup, mode, cfg)
        if best is None or p.max_seq > best.max_seq:
            best = p
    best.config, best.option = best.option, option.name
    return best


def plan(shape: ModelShape, setup: Setup, modes=None, options=OPTIONS) -> list[Prediction]:
    """One :class:`Prediction` per mode (default: every registered backend) x memory option set."""
    return [best_prediction(shape, setup, m, o) for m in modes or registry.SEQ_ALGOS for o in options]
