"""The terms of every phase of one training step, for a model, a :class:`~easy_context.plan.setup.Setup`, a mode and a
memory option, gathered into a :class:`~easy_context.plan.budget.Budget` by :func:`build_budget`. What each term
counts: docs/planner.md."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from easy_context.core.layout import Layout
from easy_context.kernels.base import call_heads
from easy_context.models.shapes import ModelShape
from easy_context.plan.budget import Budget, Term
from easy_context.plan.options import MemOption
from easy_context.plan.setup import (
    MAX_LIVE_PARAMETERS,
    NORM_CHUNK_ROWS,
    NORM_CHUNK_TEMPS,
    SUB_GROUP_SIZE,
    Setup,
    mode_layout,
)


def _pinned(nbytes: float, pow2: bool) -> float:
    """Bytes PyTorch's pinned host allocator takes for a block of ``nbytes`` (rounded up to a power of two)."""
    return 2 ** math.ceil(math.log2(nbytes)) if pow2 and nbytes > 0 else nbytes


@dataclass(frozen=True)
class _Units:
    """Bytes per local token of one tensor of each activation unit (docs/planner.md, "Activation units")."""

    A: int  # one bf16 hidden-size tensor
    Q: int  # bf16 q-sized
    K: int  # bf16 K (or V)
    M: int  # bf16 MLP intermediate
    LSE: int  # fp32 log-sum-exp
    Qf: int  # fp32 q-sized
    Kr: int  # K replicated to the Ulysses degree (r K)

    @classmethod
    def of(cls, shape: ModelShape, lay: Layout) -> _Units:
        K = 2 * shape.kvd
        return cls(A=2 * shape.hidden, Q=2 * shape.qd, K=K, M=2 * shape.intermediate, LSE=4 * shape.heads,
                   Qf=4 * shape.qd, Kr=lay.kv_rep * K)  # fmt: skip


class _LayerInputs(NamedTuple):
    """The layer inputs on the GPU at one end of the backward (the first layer it reaches, or layer 0)."""

    ckpt: list[Term]  # the checkpoints kept on the GPU
    x: list[Term]  # the layer's input back from the host for its recompute ("attn fwd" only)
    regen: list[Term]  # strided checkpointing: the group's regenerated inputs


def _gathers(setup: Setup) -> bool:
    """Whether ZeRO-3 gathers the parameters (every ``--optim`` but the replicated ``ddp`` and ``host_adamw``)."""
    return setup.optim not in ("ddp", "host_adamw")


def _offloaded_layers(setup: Setup, option: MemOption, offload_layers: int | None, layers: int) -> tuple[int, int]:
    """(k, stored): the layer inputs held in host memory and all checkpointed ones (``layers`` unless
    ``checkpoint_every`` > 1)."""
    stored = setup.stored_inputs(layers)
    if option.checkpointing == "full":
        k = 0
    elif option.checkpointing == "offload" or offload_layers is None:
        k = stored
    else:
        k = int(offload_layers)
        if not 0 <= k <= stored:
            raise ValueError(f"offload_layers must be in 0..{stored}, got {offload_layers}")
    return k, stored


def _gpu_reserve(setup: Setup) -> list[Term]:
    """GPU memory outside the caching allocator: the CUDA context and, with several GPUs, NCCL's buffers."""
    reserve = [Term("CUDA context + cuBLAS/cuDNN workspaces", setup.cuda_reserve)]
    if setup.gpus > 1:
        reserve.append(Term("NCCL communicator buffers", setup.nccl_reserve))
    return reserve


def _gpu_persistent(shape: ModelShape, setup: Setup) -> list[Term]:
    """Alive on the GPU the whole step: the GPU-resident model states of ``--optim``, the inputs, RoPE cos/sin."""
    h, L, P, N = shape.hidden, shape.layers, shape.params, setup.gpus
    pers: list[Term] = []
    if setup.optim == "ddp":
        pers += [Term("bf16 params (2P, replicated)", 2 * P), Term("bf16 grads (2P, replicated)", 2 * P),
                 Term("fp32 master + Adam m, v (12P, replicated)", 12 * P)]  # fmt: skip
    elif setup.optim == "host_adamw":
        pers.append(Term("bf16 params (2P)", 2 * P))
    else:
        small = L * shape.small_params_per_layer + h
        pers += [
            Term("ZeRO-3 persistent small params (norms, biases)", 2 * small),
            Term("ZeRO-3 gathered params live (2 B x min(1e9, layer params))",
                 2 * min(MAX_LIVE_PARAMETERS, L * shape.layer_params)),
            Term("ZeRO-3 reduce bucket (h^2 bf16)", 2 * h * h),
        ]  # fmt: skip
        if setup.optim in ("zero3_offload_optimizer", "zero3"):
            pers.append(Term("bf16 param partition (2P/N)", 2 * P / N))
        if setup.optim == "zero3":
            pers += [Term("bf16 grad partition (2P/N)", 2 * P / N),
                     Term("fp32 master + Adam m, v (12P/N)", 12 * P / N)]  # fmt: skip
    pers.append(Term("input ids, labels, position ids (int64)", per_token=24))
    tables = f" x {shape.rope_tables} tables (local + global)" if shape.rope_tables > 1 else ""
    pers.append(Term(f"RoPE cos/sin (bf16){tables}", per_token=4 * shape.head_dim * shape.rope_tables))
    return pers


def _layer_inputs(setup: Setup, layers: int, stored: int, resident: int, A: int) -> tuple[_LayerInputs, _LayerInputs]:
    """The checkpointed layer inputs on the GPU at the first layer the backward reaches (L-1) and at the last (0);
    ``resident`` of the ``stored`` ones stay on the GPU: those of the LAST groups."""
    top_ckpt = [Term(f"layer-input checkpoints on GPU ({resident} of {stored} x s x h x 2 B)", per_token=resident * A)]
    top_ckpt = top_ckpt if resident else []
    x_back = Term("layer input x back on GPU (recompute)", per_token=A)
    top_x = [] if resident else [x_back]
    bottom_ckpt = [Term("layer 0's input checkpoint on GPU", per_token=A)] if resident == stored else []
    bottom_x = [] if resident == stored else [x_back]
    # strided checkpointing: in a group's backward, the layer's own input is a regenerated one (counted already
    # where x comes back from the host), and the inputs of the group's earlier layers wait for their recompute
    group = min(setup.checkpoint_every, layers)

    def regenerated(own_counted: bool) -> list[Term]:
        n = group - 1 - own_counted
        return [Term(f"regenerated layer inputs of one group ({n} x s x h x 2 B)", per_token=n * A)] if n > 0 else []

    regen_top = regenerated(own_counted=bool(top_x)) if group > 1 else []
    regen_bottom = regenerated(own_counted=bool(bottom_x)) if group > 1 else []
    return _LayerInputs(top_ckpt, top_x, regen_top), _LayerInputs(bottom_ckpt, bottom_x, regen_bottom)


def _layer_grads(shape: ModelShape, setup: Setup) -> tuple[list[Term], list[Term]]:
    """The parameter gradients alive in the layer phases at the first layer the backward reaches and at layer 0."""
    if _gathers(setup):
        grads_top = grads_bottom = [Term("layer bf16 param grads before reduce-scatter", 2 * shape.layer_params)]
    elif setup.optim == "host_adamw":
        h, P = shape.hidden, shape.params
        head = shape.vocab * h  # the LM head (the tied embedding when tied)
        grads_top = [Term("bf16 grads so far: LM head, final norm, this layer", 2 * (head + h + shape.layer_params))]
        grads_bottom = [Term("bf16 grads so far: all but the input embedding", 2 * (P - (0 if shape.tied else head)))]
    else:  # ddp: persistent
        grads_top = grads_bottom = []
    return grads_top, grads_bottom


# RMSNorm (see "RMSNorm"): eager saves fp32 copies and its backward makes 5 fp32 (s, h) temporaries; chunked saves
# its input by reference + fp32 rstd, its backward works on (NORM_CHUNK_ROWS, h) fp32 chunks
def _eager_saved(shape: ModelShape) -> int:
    """What an eager RMSNorm saves, in bf16-input units: an fp32 copy of x (2) and x_hat, bf16 (Llama: 1) or fp32
    (Gemma's (1 + weight) product in fp32: 2)."""
    return 4 if shape.gemma_norm else 3


def _input_norm(shape: ModelShape, chunked_norm: bool, u: _Units) -> list[Term]:
    """What the input RMSNorm saves, and its output n1."""
    if chunked_norm:  # its input is x (the checkpoint / recompute input), counted already
        norm1 = [Term("input norm saved: fp32 rstd (x by reference)", per_token=4)]
    else:
        norm1 = [Term("input norm saved: fp32 x copy + x_hat + fp32 rstd", per_token=_eager_saved(shape) * u.A + 4)]
    norm1.append(Term("n1 = input norm output", per_token=u.A))
    return norm1


def _qk_norms_saved(shape: ModelShape, chunked_norm: bool, u: _Units) -> list[Term]:
    """What the per-head q and k norms save (Qwen3, Gemma 3): chunked, the projections' outputs by reference."""
    if not shape.qk_norm:
        return []
    rstd = 4 * (shape.heads + shape.kv_heads)
    if chunked_norm:
        return [Term("q/k norms saved: q, k before them (by reference) + fp32 rstd", per_token=u.Q + u.K + rstd)]
    return [Term("q/k norms saved: fp32 q, k copies + x_hat + fp32 rstd",
                 per_token=_eager_saved(shape) * (u.Q + u.K) + rstd)]  # fmt: skip


def _sandwich_norms_saved(shape: ModelShape, chunked_norm: bool, u: _Units, norms: int) -> list[Term]:
    """What the norms on the attention's and the MLP's outputs save (Gemma 2/3): ``norms`` = 2 in the MLP's backward
    (the post-MLP norm's backward runs just before it: its saved input or its dx), 1 in the pre-MLP norm's (the
    post-attention norm's, consumed before the attention's backward)."""
    if not shape.sandwich_norms:
        return []
    each = u.A + 4 if chunked_norm else _eager_saved(shape) * u.A + 4
    how = "inputs (by reference)" if chunked_norm else "fp32 copies + x_hat"
    which = "post-attention + post-MLP norms" if norms == 2 else "post-attention norm"
    return [Term(f"{which} saved: {how} + fp32 rstd", per_token=norms * each)]


def _post_norm_saved(shape: ModelShape, chunked_norm: bool, u: _Units) -> Term:
    """What the RMSNorm before the MLP saves (Llama's post-attention norm, Gemma's pre-feedforward one)."""
    if chunked_norm:  # h1 = x + attn out, kept alive by the norm (eager frees it: it saves an fp32 copy)
        return Term("post norm saved: h1 (bf16, by reference) + fp32 rstd", per_token=u.A + 4)
    return Term("post norm saved: fp32 h1 copy + x_hat + fp32 rstd", per_token=_eager_saved(shape) * u.A + 4)


def _attention_saved(lay: Layout, u: _Units) -> Term:
    """What the attention saves for its backward (under Ulysses, its all-to-all copies too)."""
    if lay.ulysses > 1:
        return Term(
            "attention saved: q', k', v', out' (all-to-all copies), out, lse", per_token=3 * u.Q + 2 * u.Kr + u.LSE
        )
    return Term("attention saved: q, k, v, out, lse", per_token=2 * u.Q + 2 * u.K + u.LSE)


def _attn_fwd(lay: Layout, u: _Units, norm1: list[Term], dy: Term) -> list[Term]:
    """``attn fwd``: the recompute of one layer, in the attention kernel, with the mode's forward buffers."""
    Q, Kr, LSE, Qf = u.Q, u.Kr, u.LSE, u.Qf
    fwd = norm1 + [dy, Term("q, k, v", per_token=Q + 2 * u.K)]
    if lay.ulysses > 1:
        fwd.append(Term("Ulysses all-to-all copies q', k', v'", per_token=Q + 2 * Kr))
        if lay.kv_rep > 1:
            fwd.append(Term(f"K/V replicated x{lay.kv_rep} before all-to-all", per_token=2 * Kr))
    if lay.blockwise:
        fwd.append(Term("ring: stacked K/V copy", per_token=2 * Kr))
        if lay.ring > 1:
            fwd.append(Term("ring: K/V in flight", per_token=2 * Kr))
        fwd.append(Term("ring: fp32 out + lse accumulators", per_token=Qf + LSE))
        fwd.append(Term("ring: one block's kernel out + lse", per_token=Q + LSE))
        if lay.borrows_queries:
            fwd.append(Term("dist_flash: borrowed q + helper's fp32 partial out, lse", per_token=Q + Qf + LSE))
    else:
        fwd.append(Term("kernel out + lse", per_token=Q + LSE))
    return fwd


def _mlp_bwd(shape: ModelShape, setup: Setup, option: MemOption, u: _Units, common: list[Term], dy: Term,
             post_saved: Term) -> list[Term]:  # fmt: skip
    """``mlp bwd``: the backward of the recomputed layer's MLP, whole or one tile of it."""
    h, i, A, M = shape.hidden, shape.intermediate, u.A, u.M
    mlp = common + [dy, post_saved, Term("n2 = post norm output", per_token=A)]
    if option.tiled_mlp:
        if setup.mlp_tile_tokens:
            t = setup.mlp_tile_tokens
            mlp.append(Term(f"MLP: 6 x tile x i x 2 B (one tile of {t} tokens)", 6 * M * t))
        elif setup.mlp_tiles:
            mlp.append(Term(f"MLP: 6 x (s/{setup.mlp_tiles}) x i x 2 B (one tile)", per_token=6 * M / setup.mlp_tiles))
        else:
            mlp.append(Term("MLP: 6 x tile x i x 2 B (tile = h tokens)", 6 * M * h))
        mlp.append(Term("tiled MLP d n2 (its input gradient, allocated whole)", per_token=A))
        mlp.append(Term("tiled MLP fp32 weight-grad accumulators (3 h i x 4 B)", 12 * h * i))
    else:
        mlp.append(Term("MLP: 6 x s x i x 2 B (gate, up, silu, prod + 2 grads)", per_token=6 * M))
    return mlp


def _norm_bwd(shape: ModelShape, chunked_norm: bool, u: _Units, common: list[Term], dy: Term,
              post_saved: Term) -> list[Term]:  # fmt: skip
    """``norm bwd``: the backward of the post-attention RMSNorm."""
    h, A = shape.hidden, u.A
    if chunked_norm:  # its incoming gradient d n2 and its output dx are whole (s, h) bf16 tensors
        temps = f"chunked RMSNorm backward fp32 temporaries ({NORM_CHUNK_TEMPS} x {NORM_CHUNK_ROWS} x h x 4 B)"
        norm_temps = Term(temps + " + fp32 d weight", NORM_CHUNK_TEMPS * NORM_CHUNK_ROWS * h * 4 + 4 * h)
        return common + [dy, post_saved, Term("d n2 (the norm's incoming gradient)", per_token=A),
                         Term("chunked RMSNorm dx (allocated whole)", per_token=A), norm_temps]  # fmt: skip
    # HF eager: fp32 autograd temporaries
    return common + [dy, Term("post norm saved: fp32 h1 copy + fp32 rstd", per_token=2 * A + 4),
                     Term("eager RMSNorm backward fp32 temporaries (5 x s x h x 4 B)", per_token=10 * A)]  # fmt: skip


def _kernel_bwd(shape: ModelShape, setup: Setup, lay: Layout, u: _Units, block: str) -> list[Term]:
    """The local kernel's backward: its dq, dk, dv, workspace and GQA expansion, for whole calls or, with
    ``attn_heads_per_call``, calls of a few query heads (:func:`easy_context.kernels.base.head_groups`)."""
    Q, Kr, LSE, Qf = u.Q, u.Kr, u.LSE, u.Qf
    hq, hkv = shape.heads // lay.ulysses, max(1, shape.kv_heads * lay.kv_rep // lay.ulysses)  # this rank's heads
    most = setup.attn_heads_per_call or hq
    c = call_heads(hq, hkv, lambda c: c <= most) or hq
    if c == hq:
        terms = [Term(f"{block}kernel dq, dk, dv", per_token=Q + 2 * Kr),
                 Term("kernel workspace (fp32 dq accum + delta)", per_token=Qf + LSE)]  # fmt: skip
        if Kr < Q:  # GQA: cuDNN and FA2 compute dK, dV per query head, then sum each group (measured on the H200)
            terms.append(Term("kernel GQA: dK, dV at the query heads before the group sum", per_token=2 * Q))
        return terms
    f = c / hq  # one call's share of the query heads
    kv_f = max(c * hkv // hq, 1) / hkv  # ... and of the K/V heads
    shared = c < hq // hkv  # several calls per K/V head: their dK/dV add up in fp32
    call = f"one call of {c} query heads: "
    terms = [
        Term(f"{block}dq assembled + dK, dV accumulators ({'fp32' if shared else 'bf16'})",
             per_token=Q + 2 * Kr * (2 if shared else 1)),
        Term(call + "dout, q, out slices + k, v slices", per_token=3 * Q * f + (2 * Kr * kv_f if kv_f < 1 else 0)),
        Term(call + "its dq, dk, dv", per_token=Q * f + 2 * Kr * kv_f),
        Term(call + "workspace (fp32 dq accum + delta)", per_token=(Qf + LSE) * f),
    ]  # fmt: skip
    if c > max(1, c * hkv // hq):  # a call still holds several query heads per K/V head
        terms.append(Term("one call's GQA: dK, dV at its query heads", per_token=2 * Q * f))
    return terms


def _attn_bwd(shape: ModelShape, setup: Setup, lay: Layout, u: _Units, common: list[Term]) -> list[Term]:
    """``attn bwd``: the backward of the distributed attention, with the mode's backward buffers."""
    Q, Kr, LSE, Qf = u.Q, u.Kr, u.LSE, u.Qf
    bwd = common + [
        Term("d h1 (the residual gradient, also the layer input's)", per_token=u.A),
        Term("d out", per_token=Q),
    ]
    if lay.ulysses > 1:
        bwd.append(Term("Ulysses: exchanged d out' + dq, dk, dv exchanged back", per_token=2 * Q + 2 * Kr))
    if lay.blockwise:
        bwd.append(Term("ring: stacked K/V copy" + (" + in flight" if lay.ring > 1 else ""),
                        per_token=2 * Kr * (2 if lay.ring > 1 else 1)))  # fmt: skip
        bwd.append(Term("ring: fp32 dq accumulator", per_token=Qf))
        bwd.append(Term("ring: fp32 dK/dV travelling" + (" + in flight" if lay.ring > 1 else ""),
                        per_token=4 * Kr * (2 if lay.ring > 1 else 1)))  # fmt: skip
        bwd += _kernel_bwd(shape, setup, lay, u, "one block's ")
        if lay.borrows_queries:
            bwd.append(Term("dist_flash: borrowed q, dout, out, lse + fp32 partial dq", per_token=3 * Q + LSE + Qf))
    else:
        bwd += _kernel_bwd(shape, setup, lay, u, "")
    return bwd


def _qk_norm_bwd(shape: ModelShape, chunked_norm: bool, u: _Units, common: list[Term]) -> list[Term]:
    """``qk norm bwd``: the q norm's backward, after the attention's and RoPE's (their q, k gradients alive)."""
    grads = [Term("d h1 (the residual gradient, also the layer input's)", per_token=u.A),
             Term("kernel dq, dk, dv + dq, dk through RoPE", per_token=2 * u.Q + 3 * u.K)]  # fmt: skip
    if chunked_norm:
        rows = NORM_CHUNK_TEMPS * NORM_CHUNK_ROWS * shape.head_dim * 4
        return common + grads + [Term("q norm dx (allocated whole) + chunked fp32 temporaries", rows, per_token=u.Q)]
    return common + grads + [Term("eager q-norm backward fp32 temporaries (5 x s x q x 4 B)", per_token=10 * u.Q)]


def _layer_working_sets(shape: ModelShape, setup: Setup, lay: Layout, option: MemOption,
                        u: _Units) -> dict[str, list[Term]]:  # fmt: skip
    """The activations of the four layer phases (without the layer inputs and the gradients, added per end)."""
    chunked_norm = setup.norm == "chunked"
    norm1 = _input_norm(shape, chunked_norm, u) + _qk_norms_saved(shape, chunked_norm, u)
    dy = Term("dy (grad from the layer above)", per_token=u.A)
    common = norm1 + [_attention_saved(lay, u)]
    post_saved = _post_norm_saved(shape, chunked_norm, u)
    mlp_side = common + _sandwich_norms_saved(shape, chunked_norm, u, norms=2)
    norm_side = common + _sandwich_norms_saved(shape, chunked_norm, u, norms=1)
    sets = {
        "attn fwd": _attn_fwd(lay, u, norm1, dy),
        "mlp bwd": _mlp_bwd(shape, setup, option, u, mlp_side, dy, post_saved),
        "norm bwd": _norm_bwd(shape, chunked_norm, u, norm_side, dy, post_saved),
        "attn bwd": _attn_bwd(shape, setup, lay, u, common),
    }
    if shape.qk_norm:
        sets["qk norm bwd"] = _qk_norm_bwd(shape, chunked_norm, u, common)
    return sets


def _layer_phases(shape: ModelShape, setup: Setup, lay: Layout, option: MemOption, u: _Units, top: _LayerInputs,
                  bottom: _LayerInputs) -> dict[str, list[Term]]:  # fmt: skip
    """The layer phases at the first layer the backward reaches and, with ``host_adamw`` (whose gradients grow
    through the backward), at the last layer (0) too."""
    work = _layer_working_sets(shape, setup, lay, option, u)
    grads_top, grads_bottom = _layer_grads(shape, setup)
    fwd_grads = [] if _gathers(setup) else grads_top  # ZeRO: the grads come later
    by_ref = setup.norm == "chunked"  # the chunked input norm keeps the layer input x back from the host alive

    def at(end: _LayerInputs, grads: list[Term], suffix: str) -> dict[str, list[Term]]:
        fwd = {f"attn fwd{suffix}": end.ckpt + end.x + end.regen + work["attn fwd"] + (fwd_grads if not suffix
                                                                                          else grads)}  # fmt: skip
        bwd = {f"{name}{suffix}": end.ckpt + (end.x if by_ref else []) + end.regen + terms + grads
               for name, terms in work.items() if name != "attn fwd"}  # fmt: skip
        return fwd | bwd

    phases = at(top, grads_top, "")
    if setup.optim == "host_adamw":  # the gradients grow through the backward: layer 0 is a moment of its own
        phases |= at(bottom, grads_bottom, " @ layer 0")
    return phases


def _loss(shape: ModelShape, setup: Setup, option: MemOption, u: _Units, top_ckpt: list[Term]) -> list[Term]:
    """``loss``: the first moment of the backward (final norm, logits or chunked CE, the LM head's gradient)."""
    h, V, A = shape.hidden, shape.vocab, u.A
    if setup.norm == "chunked":
        final_norm = Term("final norm saved (its input by reference, rstd) + its output", per_token=2 * A + 4)
    else:
        final_norm = Term("final norm saved (fp32 copy, bf16 x_hat, rstd) + its output", per_token=4 * A + 4)
    loss = top_ckpt + [final_norm, Term("d hidden", per_token=A)]
    if option.chunked_loss:
        loss.append(Term(f"chunked CE: 3 x {setup.loss_chunk} x V fp32 buffers", 3 * setup.loss_chunk * V * 4))
        loss.append(Term("chunked CE: fp32 lse, int64 target, valid", per_token=13))
        loss.append(Term("chunked CE: fp32 LM-head grad + bf16 cast", 4 * V * h if setup.optim == "ddp" else 6 * V * h))
    else:
        loss.append(Term("plain logits: bf16 + fp32 upcast + fp32 log-softmax", per_token=10 * V))
        if setup.optim != "ddp":
            loss.append(Term("LM head bf16 grad", 2 * V * h))
    if _gathers(setup):
        loss.append(Term("LM head gathered (bf16)", 2 * V * h))
    return loss


def _embedding_bwd(shape: ModelShape, setup: Setup, u: _Units) -> list[Term]:
    """``embedding bwd``: the embedding's backward (and, gather modes, its gathered weight and gradient)."""
    emb = [Term("d embeddings output", per_token=u.A),
           Term("embedding backward: fp32 per-segment partial sums (<= 2A)", per_token=2 * u.A)]  # fmt: skip
    if _gathers(setup):
        emb.append(Term("embedding gathered + bf16 grad", 4 * shape.vocab * shape.hidden))
    elif setup.optim == "host_adamw":
        emb.append(Term("bf16 grads (2P)", 2 * shape.params))
    return emb


def _optimizer_step(shape: ModelShape, setup: Setup) -> list[Term]:
    """``optimizer step``: no activations, the optimizer's GPU transients."""
    P, N = shape.params, setup.gpus
    if setup.optim == "zero3":
        return [Term("fp32 grad of one sub-group", 4 * min(P / N, SUB_GROUP_SIZE))]
    if setup.optim == "ddp":
        return [Term("foreach AdamW fp32 temporaries (~4P)", 4 * P)]
    if setup.optim == "host_adamw":
        return [Term("bf16 grads (2P)", 2 * P)]
    return []


def _host(shape: ModelShape, setup: Setup, k: int, split: bool,
          A: int) -> tuple[list[Term], dict[str, list[Term]], int]:  # fmt: skip
    """Host memory per node: the terms alive the whole step, those of each host phase, and how many offloaded
    checkpoint tensors the pinned allocator rounds up to a power of two."""
    P, N, G = shape.params, setup.gpus, setup.procs_per_node
    host = [Term(f"runtime reserve ({G} processes)", G * setup.host_reserve)]
    share = G / N
    if setup.optim in ("zero3_offload", "zero3_offload_optimizer"):
        host.append(Term("fp32 master + Adam m, v (12 B/param, node share)", 12 * P * share))
        host.append(Term("fp32 grad partition for CPU Adam (4 B/param)", 4 * P * share))
    if setup.optim == "zero3_offload":
        host.append(Term("bf16 param partition (2 B/param)", 2 * P * share))
    step_host: list[Term] = []
    if setup.optim == "host_adamw":
        big = shape.largest_param
        host.append(Term(f"HostAdamW fp32 master + Adam m, v (12 B/param x {G} processes)", 12 * P * G))
        host.append(Term("HostAdamW pinned staging: bf16 grad + bf16 param of the largest tensor",
                         G * 2 * _pinned(2 * big, setup.pinned_pow2)))  # fmt: skip
        step_host.append(Term("HostAdamW fp32 upcast of one gradient (largest tensor)", G * 4 * big))
    ckpt_host: list[Term] = []
    pow2_tensors = 0
    if k:
        kind = "pageable" if split else "pinned"
        ckpt_host.append(Term(f"offloaded checkpoints, {kind} ({G} proc x {k} layers x s x h x 2 B)",
                              per_token=G * k * A))  # fmt: skip
        pow2_tensors = G * k if setup.pinned_pow2 and not split else 0
    return host, {"forward/backward": ckpt_host, "optimizer step": step_host}, pow2_tensors


def build_budget(
    shape: ModelShape, setup: Setup, mode: str, option: MemOption, offload_layers: int | None = None
) -> Budget:
    """The terms of one step for ``mode`` and ``option`` (docs/planner.md says what each one counts).

    ``offload_layers`` (``offload-split`` only): how many layer inputs (the first ones) are offloaded, the others
    staying on the GPU; default all (use :func:`split_offload_layers` for the number the host holds at a length).
    """
    lay = mode_layout(mode, shape, setup)
    u = _Units.of(shape, lay)
    k, stored = _offloaded_layers(setup, option, offload_layers, shape.layers)
    top, bottom = _layer_inputs(setup, shape.layers, stored, stored - k, u.A)
    phases = _layer_phases(shape, setup, lay, option, u, top, bottom)
    phases |= {"loss": _loss(shape, setup, option, u, top.ckpt), "embedding bwd": _embedding_bwd(shape, setup, u)}
    phases["optimizer step"] = _optimizer_step(shape, setup)
    host, host_phases, pow2_tensors = _host(shape, setup, k, option.checkpointing == "offload-split", u.A)
    return Budget(lay, option, _gpu_reserve(setup), _gpu_persistent(shape, setup), phases, host, host_phases,
                  setup.frag, pow2_tensors, u.A, k, stored)  # fmt: skip
