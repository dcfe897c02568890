"""Memory options: where the checkpointed layer inputs live, tiled MLP, chunked loss (see docs/planner.md)."""

from __future__ import annotations

from dataclasses import dataclass

CHECKPOINTING = ("full", "offload", "offload-split")


@dataclass(frozen=True)
class MemOption:
    """One memory configuration (or, in :data:`OPTIONS`, a set whose features may each be left off)."""

    name: str
    checkpointing: str  # "full" (layer inputs on GPU), "offload" (pinned host), "offload-split" (host, rest GPU)
    tiled_mlp: bool
    chunked_loss: bool


OPTIONS = (
    MemOption("full", "full", False, False),
    MemOption("offload", "offload", False, False),
    MemOption("offload+tiled", "offload", True, False),
    MemOption("offload+tiled+chunked", "offload", True, True),
    MemOption("offload-split+tiled+chunked", "offload-split", True, True),
)
OPTION_BY_NAME = {o.name: o for o in OPTIONS}


def config_name(checkpointing: str, tiled_mlp: bool, chunked_loss: bool) -> str:
    """The name of a configuration: its checkpointing, then ``+tiled``, ``+chunked``."""
    return checkpointing + ("+tiled" if tiled_mlp else "") + ("+chunked" if chunked_loss else "")


def allowed_configs(option: MemOption) -> list[MemOption]:
    """The concrete configurations a memory option set allows, the full set first.

    Each feature of the set may be left off (offloaded checkpoints cost host memory and a staging copy, tiled MLP
    fp32 weight-grad accumulators, chunked loss an fp32 LM-head gradient): at a short local length the feature
    can cost more than it saves, and a user would not turn it on. So the prediction of a set is the best of its
    subsets, and the summary never gets worse from left to right. ``offload-split`` needs no ``full`` fallback:
    its number of offloaded layers already ranges over 0..L."""
    ckpts = [option.checkpointing] + (["full"] if option.checkpointing == "offload" else [])
    tiles = [option.tiled_mlp] + ([False] if option.tiled_mlp else [])
    chunks = [option.chunked_loss] + ([False] if option.chunked_loss else [])
    return [MemOption(config_name(c, t, ch), c, t, ch) for c in ckpts for t in tiles for ch in chunks]


def parse_config(name: str) -> MemOption:
    """ "offload+tiled+chunked" -> a concrete MemOption (checkpointing full|offload|offload-split, then +tiled,
    +chunked)."""
    ckpt, *features = name.split("+")
    if ckpt not in CHECKPOINTING or set(features) - {"tiled", "chunked"}:
        raise ValueError(
            f"bad memory configuration {name!r}: full|offload|offload-split, then optional +tiled, +chunked"
        )
    return MemOption(config_name(ckpt, "tiled" in features, "chunked" in features), ckpt, "tiled" in features,
                     "chunked" in features)  # fmt: skip
