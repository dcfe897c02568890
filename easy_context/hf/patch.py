"""Switch transformers models to sequence-parallel attention through the attention registry.

``apply_seq_parallel_monkey_patch(seq_algo, model)`` registers our attention function under a name and
sets it on the model (``model.set_attn_implementation``); no model code is copied or replaced. The switched model
gets configs of its own first, one object for its whole tree whatever parts of it were switched in whatever order
(:mod:`easy_context.hf.tree_config`): transformers' ``from_config`` shares one config among the models built from it,
and the others keep their attention; a part of a switched model is refused another backend than the model's. The
backend is looked up once, at the switch; its object is passed down. For
EasyContext compatibility ``model`` may also be a model-type string (``"llama"``, ``"qwen2"``, ...): models of
that type built afterwards are switched at the end of their construction (``PreTrainedModel.post_init``); under
data_parallel one built with ``attn_implementation=`` named keeps it (on one process that is the user's choice, under
SP another attention would compute each shard alone).

A model whose config asks for attention weights (``output_attentions``) is refused when switched and at every forward
(transformers does not pass the config's flag to the attention function). On one process (data parallel, or an SP
group of one) a forward that carries transformers' KV cache (``generate()``: prefill and decode steps) or a padding
``attention_mask`` runs the model's own attention for that forward: transformers builds masks and caches only for its
own implementations, and gives its own numbers (with a padding mask its rules apply: position ids that restart do not
mask documents); such a mask reaching easy_context's attention later (gradient checkpointing's recompute) goes to the
model's own attention function too. Under SP a forward pre-hook guards what the attention function cannot see: a padding
``attention_mask`` (transformers drops masks for custom attention names) becomes documents when it pads on the left
or the right (:func:`_padding_as_documents`, exact) and is refused with zeros between real tokens; missing
``position_ids`` (each rank must pass the global positions of its shard), ``labels=`` on a shard (transformers' loss
would shift each shard on its own: ``shift_labels=`` with the shard of the globally shifted targets is the way, and
``num_items_in_batch=`` the global count of targets makes each rank's loss its share of the token mean) and KV
caches (refused, naming ``easy_context.eval.forward.greedy_generate``). An all-ones mask is dropped, except next to
packed documents: transformers masks documents only without an ``attention_mask`` (with one it attends across them),
so that combination is refused rather than guessed.

Models the attention cannot serve are refused when patched (:mod:`easy_context.hf.support`: recurrent / convolution /
sparse layer kinds, attention outside ``AttentionInterface``) or at the first forward that never reaches it; RoPE
modules whose frequencies depend on the largest position id see the SP group's (docs/models.md).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from easy_context.core.documents import local_documents
from easy_context.core.groups import get_sp_group
from easy_context.core.registry import checked_documents, get_seq_algo
from easy_context.core.seq_algo import KERNEL_OPTIONS, SeqAlgo
from easy_context.hf.attention import attention_calls, make_hf_attention, sp_world
from easy_context.hf.kv_cache import active_cache
from easy_context.hf.support import (
    attention_not_called,
    check_attention_outputs,
    check_model_supported,
    check_switched,
    decoder_of,
    global_rope_positions,
    sequence_dependent_rope,
)
from easy_context.hf.tree_config import private_config, switched_root

_TYPE_PATCHES: dict[str, tuple[SeqAlgo, dict[str, Any]]] = {}
_POST_INIT_PATCHED = False


def attention_name(seq_algo: SeqAlgo | str, **options: Any) -> str:
    """The registry name for ``seq_algo`` (a backend or its name) with ``options`` (registered on first use)."""
    algo = get_seq_algo(seq_algo)  # validates a name
    suffix = "".join(f"__{k}_{v}" for k, v in sorted(options.items()) if v is not None)
    # transformers treats any name containing "flash" as a flash-attention kernel request: avoid the word
    name = f"easy_context_{algo.name}{suffix}".replace("flash", "fl4sh")
    if name not in ALL_ATTENTION_FUNCTIONS.valid_keys():
        AttentionInterface.register(name, make_hf_attention(algo, **options))
    return name


def _padded(mask: torch.Tensor | None) -> bool:
    """Whether an ``attention_mask`` masks anything (a 2-D padding mask with a zero, or a 4-D mask)."""
    return mask is not None and not bool(torch.all(mask == 1))


def _padding_as_documents(algo: SeqAlgo, mask: torch.Tensor, position_ids: torch.Tensor,
                          options: dict[str, Any]) -> torch.Tensor:  # fmt: skip
    """This rank's ``position_ids`` (batch, seq_local) with a padding ``attention_mask`` shard (batch, seq_local)
    turned into documents: every pad token gets its row's first real position, so each pad is a document of its own
    (a restart at the row's smallest position) and the real tokens one document that never attends to a pad. With the
    real tokens' positions unchanged that is transformers' masked attention at every real token, for left padding
    (``generate()``'s: positions restarting at the first real token, or counting from the row's start) and right
    padding. ``ValueError`` for zeros between real tokens, real tokens whose positions restart (packed documents, which
    transformers does not mask next to an attention_mask), or a mask not sharded like the inputs."""
    from easy_context.core.documents import gather_position_ids

    seq_algo = algo.name
    if mask.dim() != 2 or mask.shape != position_ids.shape:
        raise ValueError(
            f"{seq_algo}: under sequence parallelism the attention_mask must be this rank's (batch, seq_local) shard "
            f"of the 2-D padding mask, like position_ids {tuple(position_ids.shape)}, got {tuple(mask.shape)}: pass "
            "local_attention_mask of prepare_seq_parallel_inputs(..., attention_mask=mask)"
        )
    full_mask = gather_position_ids(algo, mask.long(), None, **options) != 0
    full_pos = gather_position_ids(algo, position_ids, None, **options)
    first = full_mask.int().argmax(dim=1, keepdim=True)  # (batch, 1) the first real token (0 for an all-pad row)
    index = torch.arange(full_mask.shape[1], device=full_mask.device)[None]
    run = (index >= first) & (index < first + full_mask.sum(dim=1, keepdim=True))
    if not torch.equal(run, full_mask):
        row = int((run != full_mask).any(dim=1).nonzero()[0])
        raise ValueError(
            f"{seq_algo}: the attention_mask has zeros between real tokens (row {row}); under sequence parallelism "
            "only left and right padding are supported: pack such rows as documents instead (position_ids "
            "restarting at 0 at each, no attention_mask)"
        )
    inside = full_mask[:, 1:] & full_mask[:, :-1]
    if bool((inside & (full_pos[:, 1:] - full_pos[:, :-1] != 1)).any()):
        raise ValueError(
            f"{seq_algo}: an attention_mask was passed with position_ids that restart among the real tokens (packed "
            "documents); transformers masks documents only without an attention_mask (with one it attends across "
            "them): drop attention_mask to train with document masking, or pass contiguous position_ids"
        )
    start = full_pos.gather(1, first.to(full_pos.device))  # (batch, 1) the first real token's position
    return torch.where(mask == 0, start.to(position_ids.dtype), position_ids)


def _guard_inputs(algo: SeqAlgo, options: dict[str, Any], name: str, own: str):
    """The forward pre-hook / post-hook pair of a switched model (or its decoder); ``name``: our attention's registry
    name, ``own``: the model's own attention implementation.

    On one process (data parallel, or an SP group of one) a forward with a KV cache (``generate()``) or a padding mask
    runs the model's own attention: transformers builds its masks and cache only for its own implementations, and its
    numbers are the reference there; the post-hook (run even when the forward raises) switches back to ours."""
    seq_algo, sharded = algo.name, algo.distributed
    layout_opts = {k: v for k, v in options.items() if k not in KERNEL_OPTIONS}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        names = list(inspect.signature(module.forward).parameters)[: len(args)]
        positional = dict(zip(names, args))
        given = {**positional, **kwargs}
        check_attention_outputs(module, seq_algo, given)
        mask = given.get("attention_mask")
        cache = given.get("cache", given.get("past_key_values"))  # transformers >= 5.2x: ``cache``
        decoding = getattr(active_cache(), "mode", None) == "decode"  # one new token, the same on every rank
        world = sp_world() if sharded else 1
        if world == 1 and (cache is not None or _padded(mask)):
            module._easy_context_own = True
            module.config._attn_implementation = own
            return args, kwargs
        module._easy_context_own = False
        if cache is not None:
            raise NotImplementedError(
                f"{seq_algo}: KV caches are not supported with the sequence split over {world} ranks (generate(), "
                "cache= / past_key_values=): generate with easy_context.eval.forward.greedy_generate (its KV cache "
                "stays sharded where the prefill put it), or on one process"
            )
        position_ids = given.get("position_ids")
        if mask is not None and world > 1:  # every rank gathers (a shard may hold no pad while others do)
            if position_ids is None:
                raise ValueError(f"{seq_algo}: pass position_ids with a padding attention_mask under sequence "
                                 "parallelism (prepare_seq_parallel_inputs returns local_position_ids)")  # fmt: skip
            position_ids = _padding_as_documents(algo, mask, position_ids, layout_opts)
            if "position_ids" in positional:
                args = tuple(position_ids if n == "position_ids" else a for n, a in zip(names, args))
            else:
                kwargs["position_ids"] = position_ids
            mask = None
        if mask is not None and position_ids is not None and local_documents(algo, position_ids, **layout_opts):
            raise ValueError(
                f"{seq_algo}: an attention_mask was passed with position_ids that restart (packed documents); "
                "transformers masks documents only without an attention_mask (with one it attends across them): "
                "drop attention_mask to train with document masking, or pass contiguous position_ids"
            )
        if given.get("labels") is not None and kwargs.get("shift_labels") is None and world > 1:
            raise ValueError(
                f"{seq_algo}: labels= on a sequence shard makes transformers shift each rank's shard on its own (wrong "
                "targets where shards meet, the last ones lost); pass shift_labels= this rank's shard of the globally "
                "shifted targets: local_target_ids of easy_context.prepare_seq_parallel_inputs(seq_algo, input_ids, "
                "position_ids, easy_context.shift_targets(labels), rank, world_size, device) (keep labels= too: "
                "transformers computes a loss only when given labels, then reads shift_labels alone), with "
                "num_items_in_batch= the global count of targets != -100, then all_reduce the losses (a sum)"
            )
        if "attention_mask" in positional:
            args = tuple(None if n == "attention_mask" else a for n, a in zip(names, args))
        kwargs.pop("attention_mask", None)
        if sharded and position_ids is None:
            raise ValueError(
                f"{seq_algo}: pass position_ids: each rank holds a shard of the sequence and needs its global "
                "positions (easy_context.prepare_seq_parallel_inputs returns local_position_ids)"
            )
        if sharded and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1 and not decoding:
            # a whole sequence on every rank of a reordering layout (zigzag, USP's ring), or another backend's shards,
            # shows in the gathered positions: refuse it here (the attention would silently compute other numbers);
            # under a contiguous layout a whole sequence per rank reads as packed documents and is not caught
            checked_documents(algo, position_ids, None, layout_opts)
        if "use_cache" not in given:  # no cache built unasked (at long lengths it holds every layer's K/V)
            kwargs["use_cache"] = False
        return args, kwargs

    def after(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output) -> None:
        if getattr(module, "_easy_context_own", False):
            module.config._attn_implementation = name
            module._easy_context_own = False

    return hook, after


def _check_called(seq_algo: str):
    """A pre/post forward hook pair: the forward must have called easy_context's attention at least once (unless the
    guard sent it to the model's own attention)."""

    def before(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        module._easy_context_calls = None if getattr(module, "_easy_context_own", False) else attention_calls()

    def after(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output) -> None:
        calls = getattr(module, "_easy_context_calls", None)
        if calls is not None and attention_calls() == calls:
            raise attention_not_called(module, seq_algo)

    return before, after


def own_attention(model: PreTrainedModel) -> str:
    """The attention implementation ``model`` had before easy_context switched it or a part of it (``eager`` when it
    had none)."""
    current = model.config._attn_implementation
    if current and not _ours(current):
        return current
    recorded = (getattr(m, "_easy_context_own_attention", None) for m in model.modules())
    return next((own for own in recorded if own), None) or "eager"


def _ours(implementation: Any) -> bool:
    return str(implementation).startswith("easy_context_")


def _check_one_backend(model: PreTrainedModel, algo: SeqAlgo, name: str) -> None:
    """A part of a switched model shares the model's config, so it attends with the model's backend: switching it to
    another would leave the model's guards and the attention that runs disagreeing. Raise ``ValueError`` then."""
    root = switched_root(model)
    current = model.config._attn_implementation
    if root is None or root is model or not _ours(current) or current == name:
        return
    whole = type(root).__name__
    raise ValueError(
        f"{algo.name}: {type(model).__name__} is part of a {whole} that attends with {current!r}, and a model and "
        f"its parts share one config, so one attention backend: switch the {whole} itself to change the backend "
        "(apply_seq_parallel_monkey_patch(seq_algo, model) on the whole model), or this part with the same backend "
        "and options"
    )


def _switch(model: PreTrainedModel, algo: SeqAlgo, options: dict[str, Any]) -> PreTrainedModel:
    """Switch ``model`` (and every part of it) to ``algo``'s attention with ``options``."""
    sharded = algo.distributed
    check_model_supported(model, algo.name, sharded)
    check_attention_outputs(model, algo.name)
    name = attention_name(algo, **options)
    _check_one_backend(model, algo, name)
    own = own_attention(model)
    private_config(model)
    model.set_attn_implementation(name)
    check_switched(model, algo.name, name)
    for module in model.modules():  # attention layers delegate masks built for the model's own attention to it
        module._easy_context_own_attention = own
    # the LM, its decoder, and parts switched before (a model has one backend: theirs is replaced)
    guarded = [model, decoder_of(model), *(m for m in model.modules() if getattr(m, "_easy_context_hooks", ()))]
    for module in {id(m): m for m in guarded}.values():
        for handle in getattr(module, "_easy_context_hooks", ()):
            handle.remove()
        guard, restore = _guard_inputs(algo, options, name, own)
        hooks = [module.register_forward_pre_hook(guard, with_kwargs=True),
                 module.register_forward_hook(restore, with_kwargs=True, always_call=True)]  # fmt: skip
        if sharded:
            before, after = _check_called(algo.name)
            hooks += [module.register_forward_pre_hook(before, with_kwargs=True),
                      module.register_forward_hook(after, with_kwargs=True)]  # fmt: skip
        module._easy_context_hooks = tuple(hooks)
    for rotary in sequence_dependent_rope(model):  # installed when sharded, removed otherwise
        global_rope_positions(rotary, get_sp_group if sharded else None)
    return model


def _patch_post_init() -> None:
    global _POST_INIT_PATCHED
    if _POST_INIT_PATCHED:
        return
    original_init, original_post_init = PreTrainedModel.__init__, PreTrainedModel.post_init

    def __init__(self: PreTrainedModel, config, *args, **kwargs):
        requested = getattr(config, "_attn_implementation", None)  # before transformers picks a default
        original_init(self, config, *args, **kwargs)
        self._easy_context_requested = requested

    def post_init(self: PreTrainedModel, *args, **kwargs):
        original_post_init(self, *args, **kwargs)
        patch = _TYPE_PATCHES.get(getattr(self.config, "model_type", None))
        if patch is None:
            return
        requested = getattr(self, "_easy_context_requested", None)
        # on one process an attn_implementation asked for by name is the user's choice for this model (the same
        # numbers either way); under SP every model of the type is switched: another attention would compute each
        # rank's shard alone (EasyContext's scripts load with attn_implementation="flash_attention_2", then patch)
        if requested is None or _ours(requested) or patch[0].distributed:
            shared = self.config
            _switch(self, patch[0], patch[1])
            # transformers wrote its default attention into the config it was given; the next model built from that
            # config must see what was asked of it (nothing), not this model's default, to be switched as well
            shared._attn_implementation_internal = requested

    PreTrainedModel.__init__ = __init__
    PreTrainedModel.post_init = post_init
    _POST_INIT_PATCHED = True


# Model types whose own (eager/sdpa) attention in transformers builds its masks without position_ids, so packed
# documents attend across each other on one process (gpt-oss: 1.09 relative logit error against each document alone;
# test_transformers_masks_documents in tests/distributed/test_documents_models.py pins the list). data_parallel routes
# them through easy_context's attention, which masks documents as every SP backend does (and as their flash-attention
# path does).
OWN_MASKS_IGNORE_POSITION_IDS = frozenset({"gpt_oss", "afmoe"})


def apply_seq_parallel_monkey_patch(seq_algo: str | SeqAlgo, model: PreTrainedModel | str, always: bool = False,
                                    **options: Any):  # fmt: skip
    """Make ``model`` (a loaded PreTrainedModel, or a model-type string) use ``seq_algo`` attention (a backend's name,
    or the backend).

    ``options`` go to the backend (``kernel="auto"``, ``ring_degree=...`` for usp_attn). ``data_parallel``
    leaves the model's own attention untouched unless a named ``kernel`` (not ``"auto"``) is given or ``always``
    (or the model type is in :data:`OWN_MASKS_IGNORE_POSITION_IDS`); then the model attends through easy_context's
    local-kernel interface (checkpoint-after-attention needs it).
    Returns the model (None for a model-type string).
    """
    algo = get_seq_algo(seq_algo)
    algo.attn_func(**options)  # validates the options now, not at the first forward
    patches = algo.distributed or always or options.get("kernel", "auto") != "auto"
    model_type = model if isinstance(model, str) else getattr(getattr(model, "config", None), "model_type", None)
    if not patches and model_type in OWN_MASKS_IGNORE_POSITION_IDS:
        patches = True
        warnings.warn(f"{model_type}: transformers' own attention ignores position_ids when it builds its masks "
                      "(packed documents would attend across each other); data_parallel runs easy_context's "
                      "attention, which masks each document", stacklevel=2)  # fmt: skip
    if isinstance(model, str):
        if patches:
            _TYPE_PATCHES[model] = (algo, dict(options))
            _patch_post_init()
        else:
            _TYPE_PATCHES.pop(model, None)
        return None
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel or a model-type string, got {type(model).__name__}")
    if not patches:
        return model
    return _switch(model, algo, dict(options))
