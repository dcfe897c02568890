"""easy_context.memory: offloaded activation checkpointing and tiled MLPs equal the plain model (CPU, fp32)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import easy_context.memory.offload_checkpoint as oc
from easy_context.memory import (
    apply_unsloth_offloaded_gradient_checkpoint_monkey_patch,
    enable_offloaded_checkpointing,
    enable_tiled_mlp,
    offloaded_checkpoint,
    revert_unsloth_offloaded_gradient_checkpoint_monkey_patch,
)

BATCH, SEQ, LAYERS, HIDDEN = 2, 40, 2, 64
MODES = ["hf_patch", "offload", "tiled", "offload+tiled"]


def _config(model_type: str):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(hidden_size=HIDDEN, intermediate_size=160, num_hidden_layers=LAYERS, vocab_size=128)
    common |= dict(num_attention_heads=4, num_key_value_heads=2)
    if model_type == "llama":
        return LlamaConfig(**common)
    if model_type == "qwen2":
        return Qwen2Config(**common)
    return Qwen3Config(**common, head_dim=16)


def _model(model_type: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(_config(model_type)), attn_implementation="sdpa")
    return model.float().train()


def _loss_and_grads(model) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (BATCH, SEQ), generator=g)
    labels = torch.randint(0, 128, (BATCH, SEQ), generator=g)
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels, use_cache=False).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


class _HookLog:
    """Wraps the offload pack/unpack hooks to record what goes to the host and back."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.packed: list[tuple[tuple[int, ...], torch.device, bool]] = []  # (shape, host device, is a copy)
        self.unpacked: list[tuple[tuple[int, ...], torch.device]] = []
        pack, unpack = oc.pack_to_host, oc.unpack_to_device

        def logged_pack(t: torch.Tensor, **kw):
            packed = pack(t, **kw)
            self.packed.append((tuple(t.shape), packed.host.device, packed.host.data_ptr() != t.data_ptr()))
            return packed

        def logged_unpack(packed):
            t = unpack(packed)
            self.unpacked.append((tuple(t.shape), t.device))
            return t

        monkeypatch.setattr(oc, "pack_to_host", logged_pack)
        monkeypatch.setattr(oc, "unpack_to_device", logged_unpack)


@pytest.fixture
def hf_patch():
    apply_unsloth_offloaded_gradient_checkpoint_monkey_patch()
    yield
    revert_unsloth_offloaded_gradient_checkpoint_monkey_patch()


_REFERENCE: dict[str, tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_model_parity(model_type: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if model_type not in _REFERENCE:
        _REFERENCE[model_type] = _loss_and_grads(_model(model_type))
    ref_loss, ref_grads = _REFERENCE[model_type]

    log = _HookLog(monkeypatch)
    if mode == "hf_patch":
        existing = _model(model_type)  # built before the patch, enabled after it
        apply_unsloth_offloaded_gradient_checkpoint_monkey_patch()
        try:
            model = _model(model_type) if model_type == "qwen3" else existing  # ... or built after it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # the alias is deprecated in transformers 5
                model.gradient_checkpointing_enable()
        finally:
            revert_unsloth_offloaded_gradient_checkpoint_monkey_patch()
        funcs = [layer._gradient_checkpointing_func for layer in model.model.layers]
        assert all(f.func is offloaded_checkpoint and f.keywords == {"use_reentrant": False} for f in funcs)
    else:
        model = _model(model_type)
        if "offload" in mode:
            enable_offloaded_checkpointing(model)
        if "tiled" in mode:
            enable_tiled_mlp(model, num_tiles=3)  # 14 + 13 + 13 tokens

    loss, grads = _loss_and_grads(model)
    assert _rel_err(loss, ref_loss) < 1e-5
    assert grads.keys() == ref_grads.keys()
    errs = {n: _rel_err(grads[n], ref_grads[n]) for n in ref_grads}
    assert max(errs.values()) < 1e-5, sorted(errs.items(), key=lambda kv: -kv[1])[:3]

    if mode == "tiled":
        assert log.packed == [] and log.unpacked == []
    else:  # every layer's input (b, s, hidden) went to the host as a copy, and came back for the recompute
        assert log.packed == [((BATCH, SEQ, HIDDEN), torch.device("cpu"), True)] * LAYERS
        assert log.unpacked == [((BATCH, SEQ, HIDDEN), torch.device("cpu"))] * LAYERS


class _OpCount(TorchDispatchMode):
    """Counts calls of one aten op."""

    def __init__(self, op):
        super().__init__()
        self.op, self.calls = op, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is self.op
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_replay_attention_checkpointing(model_type: str, offload: bool) -> None:
    """Checkpoint-after-attention through the HF layers: same loss and grads, one attention forward per layer."""
    import easy_context as ec

    if model_type not in _REFERENCE:
        _REFERENCE[model_type] = _loss_and_grads(_model(model_type))
    ref_loss, ref_grads = _REFERENCE[model_type]
    fwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    ec.kernels.get_kernel("cpu", "cpu", torch.float32, 16)  # its one-time probe call is not counted below
    calls = {}
    for replay in (False, True):
        model = _model(model_type)
        ec.apply_seq_parallel_monkey_patch("data_parallel", model, kernel="cpu")
        enable_offloaded_checkpointing(model, offload=offload, replay_attention=replay)
        with _OpCount(fwd_op) as count:
            loss, grads = _loss_and_grads(model)
        calls[replay] = count.calls
        assert _rel_err(loss, ref_loss) < 1e-5
        errs = {n: _rel_err(grads[n], ref_grads[n]) for n in ref_grads}
        assert max(errs.values()) < 1e-5, sorted(errs.items(), key=lambda kv: -kv[1])[:3]
    assert calls == {False: 2 * LAYERS, True: LAYERS}


def test_attn_checkpointing_patches_a_model_on_its_own_attention() -> None:
    """'attn' on a model that still attends with its own sdpa (kernel "auto" under data_parallel leaves it so)
    switches it to easy_context's data_parallel attention, instead of failing: the same loss and gradients."""
    from easy_context.memory import apply_checkpointing

    if "llama" not in _REFERENCE:
        _REFERENCE["llama"] = _loss_and_grads(_model("llama"))
    ref_loss, ref_grads = _REFERENCE["llama"]
    model = _model("llama")
    assert not model.config._attn_implementation.startswith("easy_context")
    apply_checkpointing(model, "attn")
    assert model.config._attn_implementation.startswith("easy_context")
    loss, grads = _loss_and_grads(model)
    assert _rel_err(loss, ref_loss) < 1e-5
    assert max(_rel_err(grads[n], ref_grads[n]) for n in ref_grads) < 1e-5
    with pytest.raises(ValueError, match="unknown checkpointing mode"):
        apply_checkpointing(_model("llama"), "selective")


def test_partial_offload(monkeypatch: pytest.MonkeyPatch) -> None:
    """offload_layers=1: only the first layer's input goes to the host (pageable); grads unchanged."""
    if "llama" not in _REFERENCE:
        _REFERENCE["llama"] = _loss_and_grads(_model("llama"))
    ref_loss, ref_grads = _REFERENCE["llama"]
    from easy_context.memory import apply_checkpointing

    for build in (
        lambda m: enable_offloaded_checkpointing(m, offload_layers=1, pin_memory=False),
        lambda m: apply_checkpointing(m, "offload", offload_layers=1),
    ):  # train.py --offload-layers 1
        log = _HookLog(monkeypatch)
        loss, grads = _loss_and_grads(build(_model("llama")))
        assert _rel_err(loss, ref_loss) < 1e-5
        assert max(_rel_err(grads[n], ref_grads[n]) for n in ref_grads) < 1e-5
        assert log.packed == [((BATCH, SEQ, HIDDEN), torch.device("cpu"), True)]
    for mode, k in (("full", 1), ("attn", 2), ("offload", -1)):
        with pytest.raises(ValueError, match="needs a checkpointing mode that offloads"):
            apply_checkpointing(_model("llama"), mode, offload_layers=k)


def test_hf_patch_scope(hf_patch: None) -> None:
    """The patch covers both HF entry points and is reverted cleanly; enabling without it stays plain."""
    import transformers.modeling_utils as modeling_utils

    model = _model("llama")
    model.activation_checkpointing_enable()
    assert model.model.layers[0]._gradient_checkpointing_func.func is offloaded_checkpoint
    revert_unsloth_offloaded_gradient_checkpoint_monkey_patch()
    assert modeling_utils.checkpoint is torch.utils.checkpoint.checkpoint
    model.activation_checkpointing_enable()
    assert model.model.layers[0]._gradient_checkpointing_func.func is torch.utils.checkpoint.checkpoint
    enable_offloaded_checkpointing(model, offload=False)  # same code path, hooks off
    assert model.model.layers[0]._gradient_checkpointing_func.keywords["offload"] is False


def test_offload_disabled_and_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    log = _HookLog(monkeypatch)
    model = enable_offloaded_checkpointing(_model("llama"), offload=False)
    _loss_and_grads(model)
    model.eval()
    enable_offloaded_checkpointing(model)
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 8, dtype=torch.long))
    assert log.packed == []


def _deep_llama(layers: int):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = copy.deepcopy(_config("llama"))
    config.num_hidden_layers = layers
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().train()


@pytest.mark.parametrize("mode", ["full", "offload"])
@pytest.mark.parametrize("every", [2, 3, 5])
def test_checkpoint_every_keeps_one_input_per_group(mode: str, every: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """5 layers, one stored input per group of ``every``: same loss and grads as no checkpointing, ceil(5/every)
    inputs go to the host, and each group re-runs its first every-1 layers once more to regenerate the rest."""
    from easy_context.memory import apply_checkpointing

    layers = 5
    ref_loss, ref_grads = _loss_and_grads(_deep_llama(layers))
    log = _HookLog(monkeypatch)
    model = apply_checkpointing(_deep_llama(layers), mode, checkpoint_every=every)
    runs = [0] * layers
    for i, layer in enumerate(model.model.layers):
        layer.mlp.register_forward_pre_hook(lambda m, a, i=i: runs.__setitem__(i, runs[i] + 1))
    loss, grads = _loss_and_grads(model)
    assert _rel_err(loss, ref_loss) < 1e-6
    assert max(_rel_err(grads[n], ref_grads[n]) for n in ref_grads) < 1e-6
    heads = list(range(0, layers, every))
    stored = [((BATCH, SEQ, HIDDEN), torch.device("cpu"), True)] * len(heads)
    assert log.packed == (stored if mode == "offload" else [])
    last = {h: min(h + every, layers) - 1 for h in heads}  # each group's last layer needs no extra run
    assert runs == [2 + (i not in last.values()) for i in range(layers)], runs


@pytest.mark.parametrize("every", [2, 3])
def test_checkpoint_every_regenerates_under_the_forwards_autocast_and_rng(every: int) -> None:
    """Attention dropout and CPU bf16 autocast: the regenerated inputs repeat the forward's dropout masks and
    precision, so the gradients equal ordinary checkpointing's (which restores both for its recompute)."""
    from easy_context.memory import apply_checkpointing

    def run(k: int):
        model = _deep_llama(5)
        model.config.attention_dropout = 0.2
        for layer in model.model.layers:
            layer.self_attn.attention_dropout = 0.2
        apply_checkpointing(model, "full", checkpoint_every=k)
        torch.manual_seed(7)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _loss_and_grads(model)

    (ref_loss, ref_grads), (loss, grads) = run(1), run(every)
    assert _rel_err(loss, ref_loss) == 0.0
    errs = {n: _rel_err(grads[n], ref_grads[n]) for n in ref_grads}
    assert max(errs.values()) < 1e-6, sorted(errs.items(), key=lambda kv: -kv[1])[:3]


def test_checkpoint_every_state_belongs_to_its_forward() -> None:
    """Two forwards, then the first one's backward: the first one's own inputs are regenerated (the second forward
    does not overwrite them); and each forward's state is freed with its graph, with or without a backward."""
    import gc
    import weakref

    from easy_context.memory import apply_checkpointing

    ref_loss, ref_grads = _loss_and_grads(_deep_llama(5))
    model = apply_checkpointing(_deep_llama(5), "full", checkpoint_every=2)
    groups = model.model.layers[0]._gradient_checkpointing_func.keywords["groups"]
    passes, start = [], groups.start_layer
    groups.start_layer = lambda index, hidden: passes.append(weakref.ref(p := start(index, hidden))) or p
    g = torch.Generator().manual_seed(1)
    ids, labels = torch.randint(0, 128, (BATCH, SEQ), generator=g), torch.randint(0, 128, (BATCH, SEQ), generator=g)
    first = model(input_ids=ids, labels=labels, use_cache=False).loss
    second = model(input_ids=ids.flip(1), labels=labels, use_cache=False).loss
    assert len({id(ref()) for ref in passes}) == 2 and groups.current is None  # one pass per forward, none held
    first.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert _rel_err(first.detach(), ref_loss) < 1e-6
    assert max(_rel_err(grads[n], ref_grads[n]) for n in ref_grads) < 1e-6
    del first, second
    gc.collect()
    assert all(ref() is None for ref in passes)  # backward or not, nothing outlives the graph


def test_checkpoint_every_with_partial_offload(monkeypatch: pytest.MonkeyPatch) -> None:
    """offload_layers counts stored inputs: 5 layers in groups of 2 store 3 inputs; the first 2 go to the host."""
    ref_loss, ref_grads = _loss_and_grads(_deep_llama(5))
    log = _HookLog(monkeypatch)
    model = enable_offloaded_checkpointing(_deep_llama(5), offload_layers=2, pin_memory=False, checkpoint_every=2)
    loss, grads = _loss_and_grads(model)
    assert _rel_err(loss, ref_loss) < 1e-6 and max(_rel_err(grads[n], ref_grads[n]) for n in ref_grads) < 1e-6
    assert log.packed == [((BATCH, SEQ, HIDDEN), torch.device("cpu"), True)] * 2  # layers 0 and 2; layer 4 on device


def test_checkpoint_every_refuses_what_it_cannot_regenerate() -> None:
    """Hidden states changed between layers, layers out of order, attention replay, a bad K: clear errors."""
    from easy_context.memory import apply_checkpointing
    from easy_context.memory.strided_checkpoint import LayerGroups, strided_checkpoint

    groups = LayerGroups(num_layers=3, every=3)
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="layer 1 ran after the start of a forward"):
        strided_checkpoint(torch.tanh, x, groups=groups, index=1)
    y = strided_checkpoint(torch.tanh, x, groups=groups, index=0)
    with pytest.raises(RuntimeError, match="not the output of layer 0"):
        strided_checkpoint(torch.tanh, y * 2, groups=groups, index=1)
    strided_checkpoint(torch.tanh, x, groups=groups, index=0)
    with pytest.raises(RuntimeError, match="layer 2 ran after layer 0"):
        strided_checkpoint(torch.tanh, x, groups=groups, index=2)
    with pytest.raises(ValueError, match="non-reentrant checkpointing only"):
        strided_checkpoint(torch.tanh, x, groups=groups, index=0, use_reentrant=True)
    model = apply_checkpointing(_deep_llama(3), "full", checkpoint_every=2)
    loss = model(input_ids=torch.randint(0, 128, (1, 8)), labels=torch.randint(0, 128, (1, 8)), use_cache=False).loss
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="a second backward through the same graph"):
        loss.backward()
    with pytest.raises(ValueError, match="needs checkpointing mode 'full' or 'offload'"):
        apply_checkpointing(_model("llama"), "attn-offload", checkpoint_every=2)
    with pytest.raises(ValueError, match="cannot be combined with replay_attention"):
        enable_offloaded_checkpointing(_model("llama"), replay_attention=True, checkpoint_every=2)
    with pytest.raises(ValueError, match="integer >= 1"):
        apply_checkpointing(_model("llama"), "full", checkpoint_every=0)


def fsdp2_worker(rank: int, world: int, every: int) -> tuple[float, float]:
    """Llama with every decoder layer and the root under FSDP2 (fully_shard), checkpoint_every=every."""
    from torch.distributed.fsdp import fully_shard

    model = _deep_llama(5)
    enable_offloaded_checkpointing(model, offload=False, checkpoint_every=every)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    loss, grads = _loss_and_grads(model)
    norm = sum(g.full_tensor().double().pow(2).sum() for g in grads.values()).sqrt()
    return loss.item(), norm.item()


def test_checkpoint_every_under_fsdp2(dist_pool) -> None:
    """FSDP2 keeps a layer's parameters sharded outside its forward/backward: the regenerating forwards gather
    them. Loss and gradient norm equal plain checkpointing's (K=1)."""
    pool = dist_pool(2)
    ref = pool.run(fsdp2_worker, 1)
    for every in (2, 3):
        got = pool.run(fsdp2_worker, every)
        flat = lambda rows: [x for row in rows for x in row]  # noqa: E731
        assert flat(got) == pytest.approx(flat(ref), rel=1e-6), (every, got, ref)


def test_attn_global_replays_the_global_layers_only() -> None:
    """'attn-global' on a Gemma 3 pattern (sliding, full, sliding, full): the loss and gradients of plain
    checkpointing; the global layers' attention runs once, the sliding layers' twice (re-run in the backward);
    only global layers keep an attention output."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    import easy_context as ec
    from easy_context.memory import apply_checkpointing
    from easy_context.models import layer_windows

    layer_types = ["sliding_attention", "full_attention"] * 2
    config = Gemma3TextConfig(hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=4, vocab_size=128,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=5,
                              query_pre_attn_scalar=16, layer_types=layer_types)  # fmt: skip

    def build():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager").float().train()
        ec.apply_seq_parallel_monkey_patch("data_parallel", model, kernel="cpu")
        return model

    ref_loss, ref_grads = _loss_and_grads(build())
    fwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    ec.kernels.get_kernel("cpu", "cpu", torch.float32, 16)  # its one-time probe call is not counted below
    calls = {}
    for mode in ("full", "attn", "attn-global"):
        model = apply_checkpointing(build(), mode)
        assert [kind for kind, _ in layer_windows(model.config)] == ["sliding", "full", "sliding", "full"]
        with _OpCount(fwd_op) as count:
            loss, grads = _loss_and_grads(model)
        calls[mode] = count.calls
        assert _rel_err(loss, ref_loss) < 1e-5
        assert max(_rel_err(grads[n], ref_grads[n]) for n in ref_grads) < 1e-5
    # a global layer is one kernel call per forward; 'attn-global' saves the two global layers' re-runs only
    assert calls["full"] == 2 * calls["attn"] and calls["attn-global"] == calls["full"] - 2
