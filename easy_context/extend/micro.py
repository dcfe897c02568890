"""A plan's CPU miniature: the ``micro:`` section of a derived recipe (what ``MICRO=1`` / ``--micro`` runs instead).

The miniature runs every stage of the plan (the stages before the main one, the main one, the evaluations) with the
plan's backend, optimizer placement and memory options, on a tiny random model of the same family: the same
``model_type``, the same layer pattern (one period of ``layer_types``: a sliding-window layer stays one, with its
window scaled to the miniature's lengths), the same query : key/value head ratio, a few hundred tokens a sequence.
Lengths double per stage from :data:`BASE` (the full plan multiplies by 4), each a multiple of the backend's own.

A miniature never shares a folder with the real run: its run name is the real one's with :data:`SUFFIX`, its work,
results and recipe folders follow from that name, and its model is built in its own work folder (the recipe's
``model``, ``fetch``, ``work`` and ``results`` are the real run's, read only from the ``micro:`` section when given
there). Its random model folder holds :data:`MARKER`, and its summary says it is a miniature (:data:`CAVEAT`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from easy_context.extend.layout import LayoutError, PlanLayout, next_multiple
from easy_context.models.folders import MARKER, is_miniature, write_marker  # noqa: F401

BASE = 256  # the miniature's native length, tokens
HIDDEN, HEAD_DIM, INTERMEDIATE = 64, 16, 128
MIN_WINDOW = 32  # a scaled sliding window below this holds too few tokens to differ from the local block
STEPS = 3  # optimizer steps per stage: enough to save, resume and hand the model on
MAX_EXPERTS = 4
SUFFIX = "-micro"  # a miniature's run name: the real one's with this suffix (its folders follow from the name)
# the recipe's settings that name the real run's folders and model: a miniature takes them from its micro: section only
REAL_RUN_KEYS = ("work", "results", "model", "fetch", "wheels")
CAVEAT = ("CPU miniature (MICRO=1): a tiny model with random weights, a few hundred tokens, a few steps a stage; its "
          "numbers check that every stage runs, they are no result of the method")  # fmt: skip
# the config keys a miniature keeps as they are: what makes the family's layers behave as the real ones
KEPT = ("tie_word_embeddings", "partial_rotary_factor", "attn_logit_softcapping", "final_logit_softcapping",
        "use_sliding_window", "rope_parameters", "rope_theta", "rope_scaling", "hidden_act", "hidden_activation",
        "attention_bias", "mlp_bias", "use_qk_norm")  # fmt: skip


def micro_name(name: str) -> str:
    """The miniature's run name of the real run ``name`` (unchanged when it is one already)."""
    return name if name.endswith(SUFFIX) else name + SUFFIX


def micro_settings(settings: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """A miniature's pipeline settings: ``settings`` (a recipe's, its ``micro:`` values over them) without the real
    run's folders and model (:data:`REAL_RUN_KEYS`) unless ``own`` (the ``micro:`` section) gives them itself."""
    mine = {key.replace("-", "_").lower() for key in own}
    return {key: value for key, value in settings.items() if key not in REAL_RUN_KEYS or key in mine}


def layer_period(layer_types: list[str]) -> list[str]:
    """The shortest prefix whose repetition gives ``layer_types`` (the whole list when none does)."""
    n = len(layer_types)
    for p in range(1, n + 1):
        if n % p == 0 and layer_types[:p] * (n // p) == layer_types:
            return layer_types[:p]
    return layer_types


MAX_PROCESSES = 4  # tiny models: 4 processes share 2 cores well enough; more only start slower


def micro_processes(nproc: int, sp_size: int | None) -> int:
    """Processes of the miniature: the plan's own up to :data:`MAX_PROCESSES`; beyond, whole SP groups of the plan's
    size up to it (one group when it is larger)."""
    if nproc <= MAX_PROCESSES:
        return nproc
    sp = sp_size or MAX_PROCESSES
    return sp * max(1, MAX_PROCESSES // sp)


def micro_model(config: Any, native: int, layout: PlanLayout) -> dict[str, Any]:
    """The tiny model's config values (``model_type`` first; the pipeline adds the vocabulary and the native length):
    the family and layer pattern of ``config``, heads in its ratio that ``layout`` can split."""
    values = config.to_dict()
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    ratio = max(1, heads // kv)
    out: dict[str, Any] = {"model_type": config.model_type}
    types = values.get("layer_types")
    layers = layer_period(list(types)) if types else None
    out |= {"intermediate_size": INTERMEDIATE, "num_hidden_layers": len(layers or [0, 0]),
            "head_dim": HEAD_DIM}  # fmt: skip
    if layers:
        out["layer_types"] = layers
    out |= {k: values[k] for k in KEPT if values.get(k) is not None}
    if values.get("sliding_window"):
        out["sliding_window"] = max(MIN_WINDOW, values["sliding_window"] * BASE // native)
    if values.get("query_pre_attn_scalar"):
        out["query_pre_attn_scalar"] = HEAD_DIM
    for key in ("num_local_experts", "num_experts"):
        if values.get(key):
            out[key] = min(values[key], MAX_EXPERTS)
            out["num_experts_per_tok"] = min(values.get("num_experts_per_tok") or 1, 2)
    if values.get("moe_intermediate_size"):
        out["moe_intermediate_size"] = INTERMEDIATE
    degree = layout.sp
    for kv_micro in dict.fromkeys((min(kv, degree), degree, 1)):  # the real K/V heads, capped, first
        out |= {"num_attention_heads": kv_micro * ratio, "num_key_value_heads": kv_micro,
                "hidden_size": _hidden(kv_micro * ratio)}  # fmt: skip
        try:
            layout.layout(_config(out))
            break
        except LayoutError:
            continue
    return out


def _hidden(heads: int) -> int:
    """A hidden size of at least :data:`HIDDEN` that the heads divide (some families require it)."""
    width = heads * HEAD_DIM
    return width * -(-HIDDEN // width)


def _config(values: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    rest = dict(values)
    return AutoConfig.for_model(rest.pop("model_type"), vocab_size=1000, max_position_embeddings=BASE, **rest)


def micro_config(values: dict[str, Any]) -> Any:
    """The transformers config of a ``micro_model`` mapping (vocabulary 1000: the pipeline's BPE's size)."""
    return _config(values)


def micro_section(config: Any, native: int, recipe: Any, layout: PlanLayout, sliding: bool) -> dict[str, Any]:
    """The ``micro:`` settings of a derived ``recipe`` (its stages and flags) planned as ``layout`` on full-size
    ``config`` whose native length is ``native``: the tiny model, its lengths and steps, the evaluations' sizes."""
    nproc = micro_processes(layout.nproc, layout.sp_size)
    micro_layout = PlanLayout(layout.mode, nproc, layout.sp_size, layout.options)
    model = micro_model(config, native, micro_layout)
    multiple = micro_layout.multiple(_config(model))
    lengths = [next_multiple(BASE * 2 ** (i + 1), multiple) for i in range(len(recipe.all_stages))]
    target = lengths[-1]
    stages = []
    for stage, length in zip(recipe.stages, lengths):
        own = {k: v for k, v in stage.to_mapping().items() if k not in ("seq-length", "max-train-steps", "time-limit")}
        stages.append({"seq-length": length, "max-train-steps": STEPS, **own, "warmup-steps": 1})
    baselines = ["base", *(["linear"] if sliding else []), "yarn"]
    section: dict[str, Any] = {
        "micro_model": model, "device": "cpu", "nproc": nproc, "target": target, "base_length": BASE,
        "factor": target // BASE, "steps": STEPS, "stages": stages, "corpus_chars": 2.0e6, "num_proc": 2,
        "needle_min": BASE, "needle_step": max(BASE, (target - BASE) // 2), "needle_max": target, "samples": 1,
        "short": BASE, "ppl_samples": 4, "ppl_max": target, "long": 2 * target, "long_min": 2 * target,
        "long_step": target, "long_samples": 1, "long_scalings": ["none", f"yarn:2:{target}"],
        "baselines": baselines, "ruler_samples": 1, "ruler_max_new": 4, "ruler_lengths": f"{2 * BASE},{target}",
        "ruler_native": 2 * BASE, "train_chunk_s": 300,
    }  # fmt: skip
    if BASE % multiple:  # the control trains at the native length
        section["control"] = 0
    return section
