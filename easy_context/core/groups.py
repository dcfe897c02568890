"""Process groups for sequence parallelism, created once and cached.

* SP group: the ranks that share one sequence. Default: the whole world.
* DP x SP mesh: ``init_sp_groups(sp_size)`` splits the world into ``world/sp_size`` SP groups of
  consecutive ranks; ranks with the same SP rank form the DP groups (data is sharded across those).
* USP 2-D mesh inside an SP group of size W = ring_degree x ulysses_degree: SP rank i has Ulysses index
  ``i % ulysses_degree`` (Ulysses groups are consecutive ranks: all-to-all wants the fastest links) and
  ring index ``i // ulysses_degree``.

``init_sp_groups`` is collective over the world (every rank calls it). USP subgroups are created on
first use with ``new_group(..., use_local_synchronization=True)``, so only the SP group's members take
part; the first call must happen on all of them (it does: attention runs in lockstep).

Collective timeouts: a collective whose peer never comes (a stuck or crashed rank that is still alive) raises after
the group's timeout. torch gives every ``new_group`` its default (30 minutes) whatever the world group's timeout
is, so the groups made here take :func:`collective_timeout` instead: :func:`set_collective_timeout`'s value, else
``$EASY_CONTEXT_COLLECTIVE_TIMEOUT`` (seconds), else the world group's own. A launcher passes the same value to
``init_process_group`` (``collective_timeout(default_s=...)``).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

_SP_GROUP: dist.ProcessGroup | None = None
_DP_GROUP: dist.ProcessGroup | None = None
_SP_SIZE: int | None = None
_USP_CACHE: dict[tuple[tuple[int, ...], int], tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]] = {}
_TIMEOUT: datetime.timedelta | None = None  # set_collective_timeout's
TIMEOUT_ENV = "EASY_CONTEXT_COLLECTIVE_TIMEOUT"


def _seconds(value, what: str) -> datetime.timedelta:
    try:
        seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0:
        raise ValueError(f"{what} must be a number of seconds > 0, got {value!r}")
    return datetime.timedelta(seconds=seconds)


def _timeout_of(group: dist.ProcessGroup) -> datetime.timedelta | None:
    """The timeout ``group``'s backend runs its collectives with (None when it cannot be read)."""
    try:
        return group._get_backend(group._device_types[0]).options._timeout
    except Exception:  # private API (torch 2.x): without it the groups keep torch's default
        return None


def collective_timeout(default_s: float | None = None) -> datetime.timedelta | None:
    """The timeout for collectives: :func:`set_collective_timeout`'s, else ``$EASY_CONTEXT_COLLECTIVE_TIMEOUT``
    (seconds), else the world group's when it exists, else ``default_s`` (None: torch's default)."""
    if _TIMEOUT is not None:
        return _TIMEOUT
    if os.environ.get(TIMEOUT_ENV):
        return _seconds(os.environ[TIMEOUT_ENV], f"${TIMEOUT_ENV}")
    if dist.is_available() and dist.is_initialized():
        world = _timeout_of(dist.group.WORLD)
        if world is not None:
            return world
    return None if default_s is None else _seconds(default_s, "default_s")


def set_collective_timeout(seconds: float | datetime.timedelta | None) -> None:
    """Make collectives raise after ``seconds`` without their peers: every collective of the groups made here from
    now on, and the collectives (all_reduce, all_gather, all_to_all, ...) of the world group and of those made
    already. gloo keeps the timeout a group was created with for its point-to-point messages (the ring exchange):
    call this before :func:`init_sp_groups` and give ``init_process_group`` the same timeout (see
    :func:`collective_timeout`). None: new groups take the environment's / world group's again."""
    global _TIMEOUT
    _TIMEOUT = None if seconds is None else _seconds(seconds, "collective timeout")
    if _TIMEOUT is None or not (dist.is_available() and dist.is_initialized()):
        return
    groups = {id(g): g for g in [dist.group.WORLD, _SP_GROUP, _DP_GROUP, *(g for pair in _USP_CACHE.values()
                                                                          for g in pair)] if g is not None}  # fmt: skip
    for group in groups.values():
        dist.distributed_c10d._set_pg_timeout(_TIMEOUT, group)


def _new_group(ranks: list[int], **kwargs) -> dist.ProcessGroup:
    return dist.new_group(ranks, timeout=collective_timeout(), **kwargs)


def _require_dist() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "torch.distributed is not initialized: call torch.distributed.init_process_group (or start with "
            "accelerate/torchrun) before using sequence-parallel attention"
        )


def init_sp_groups(sp_size: int | None = None) -> tuple[dist.ProcessGroup, dist.ProcessGroup | None]:
    """Create (once) the DP x SP mesh; returns (sp_group, dp_group). ``sp_size=None`` means the world."""
    global _SP_GROUP, _DP_GROUP, _SP_SIZE
    _require_dist()
    world, rank = dist.get_world_size(), dist.get_rank()
    sp_size = world if sp_size is None else int(sp_size)
    if sp_size < 1 or world % sp_size != 0:
        raise ValueError(f"sp_size={sp_size} must divide the world size {world}")
    if _SP_SIZE is not None:
        if _SP_SIZE != sp_size:
            raise RuntimeError(f"SP groups already initialised with sp_size={_SP_SIZE}; call reset_groups() first")
        return get_sp_group(), _DP_GROUP
    if sp_size == world:
        sp_group = None  # the world: looked up on use, never held (a held group outlives destroy_process_group)
    else:
        sp_group = None
        for start in range(0, world, sp_size):  # every rank creates every group, in the same order
            g = _new_group(list(range(start, start + sp_size)))
            if start <= rank < start + sp_size:
                sp_group = g
    dp_group = None
    dp_size = world // sp_size
    if dp_size > 1:
        for sp_rank in range(sp_size):
            g = _new_group(list(range(sp_rank, world, sp_size)))
            if rank % sp_size == sp_rank:
                dp_group = g
    _SP_GROUP, _DP_GROUP, _SP_SIZE = sp_group, dp_group, sp_size
    return get_sp_group(), dp_group


def get_sp_group() -> dist.ProcessGroup:
    """The SP group in use: the one from :func:`init_sp_groups`, else the world."""
    _require_dist()
    return _SP_GROUP if _SP_GROUP is not None else dist.group.WORLD


def get_dp_group() -> dist.ProcessGroup | None:
    """The DP group of this rank (None when every rank is in one SP group)."""
    return _DP_GROUP


def reset_groups() -> None:
    """Forget cached groups (tests; a new process group). Call it before ``destroy_process_group``: a group
    still referenced here is only freed at interpreter exit, where gloo's worker threads can abort the process
    (see :mod:`easy_context.training.process_exit`)."""
    global _SP_GROUP, _DP_GROUP, _SP_SIZE
    _SP_GROUP = _DP_GROUP = _SP_SIZE = None
    _USP_CACHE.clear()


@dataclass(frozen=True)
class UspGroups:
    ulysses: dist.ProcessGroup
    ring: dist.ProcessGroup
    ulysses_degree: int
    ring_degree: int


def usp_layout(sp_rank: int, sp_size: int, ring_degree: int) -> tuple[int, int]:
    """(ring_index, ulysses_index) of an SP rank in the ring_degree x ulysses_degree mesh."""
    check_ring_degree(sp_size, ring_degree)
    ulysses_degree = sp_size // ring_degree
    return sp_rank // ulysses_degree, sp_rank % ulysses_degree


def check_ring_degree(sp_size: int, ring_degree: int) -> None:
    if not isinstance(ring_degree, int) or isinstance(ring_degree, bool):
        raise ValueError(f"usp_attn: ring_degree must be an integer, got {ring_degree!r}")
    if ring_degree < 1 or sp_size % ring_degree != 0:
        raise ValueError(
            f"usp_attn: ring_degree={ring_degree} must divide the sequence-parallel size {sp_size} "
            "(ulysses_degree = sp_size // ring_degree)"
        )


def get_usp_groups(group: dist.ProcessGroup, ring_degree: int) -> UspGroups:
    """The (Ulysses, ring) subgroups of ``group`` for this ring degree, created once per (group, degree)."""
    sp_size = dist.get_world_size(group)
    check_ring_degree(sp_size, ring_degree)
    ranks = tuple(dist.get_process_group_ranks(group))
    key = (ranks, ring_degree)
    if key not in _USP_CACHE:
        ulysses_degree = sp_size // ring_degree
        ring_idx, uly_idx = usp_layout(dist.get_rank(group), sp_size, ring_degree)

        def sub(members: list[int]) -> dist.ProcessGroup | None:
            if len(members) == sp_size:
                return None  # ``group`` itself: not held here (it may be the world, see reset_groups)
            return _new_group([ranks[i] for i in members], use_local_synchronization=True)

        uly = sub([ring_idx * ulysses_degree + u for u in range(ulysses_degree)])
        ring = sub([r * ulysses_degree + uly_idx for r in range(ring_degree)])
        _USP_CACHE[key] = (uly, ring)
    uly, ring = _USP_CACHE[key]
    uly, ring = (group if g is None else g for g in (uly, ring))
    return UspGroups(uly, ring, sp_size // ring_degree, ring_degree)


def launch_error(distributed: bool) -> str | None:
    """Why this launch is not one job (or None): the launcher started WORLD_SIZE > 1 processes but the framework
    runs them as independent single-process jobs (``distributed`` False: accelerate's ``DistributedType.NO``), so
    each would train alone, silently. On CPU this happens when ``accelerate launch`` runs without
    ``ACCELERATE_USE_CPU=1``."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched <= 1 or distributed:
        return None
    fix = "check the launch configuration"
    if not torch.cuda.is_available():
        fix = "on CPU set ACCELERATE_USE_CPU=1 (`accelerate launch --cpu` starts a single process)"
    return f"the launcher started {launched} processes but accelerate runs each on its own (not distributed); {fix}"
