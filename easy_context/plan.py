"""Memory planner: the byte budget of one training step and the longest trainable context, before renting GPUs.

``python -m easy_context.plan --model <config.json|hub-id|preset> --gpus N --gpu-mem 80GB --host-mem 1TB``
prints, for every sequence-parallel (SP) mode x memory option, the longest full sequence S whose training step
(forward, backward, optimizer step; micro-batch 1) fits in ``--gpu-mem`` per GPU and ``--host-mem`` per node,
and the per-component byte budget at one S. ``--json`` prints the same as JSON. Nothing is run or downloaded.
``--validate FILE`` compares the model with measured probes of ``bench/max_context.py`` (see "Validation").
``--norm chunked`` plans for :func:`easy_context.memory.enable_chunked_rmsnorm` instead of transformers' eager
RMSNorm (see "RMSNorm"; validated by one H200 probe at 417,792 tokens, see "Validation").

Units: GB = 1e9 bytes, GiB = 2**30 bytes (``--gpu-mem 80GB`` is 80e9 bytes; an "80GB" H100 really has 80 GiB,
so pass ``80GiB`` for the full card). Output is in GB (1e9); ``--validate`` prints GiB like the measurements.

How the prediction is made
--------------------------
Every byte count is ``fixed + per_token * s`` (a :class:`Term`), with ``s`` the tokens ONE rank holds:
``s = S / W`` for the SP modes (W = SP size, default the number of GPUs), ``s = S`` for ``data_parallel``.
GPU peak = CUDA reserve + (1 + fragmentation) * (persistent terms + the largest *phase*), where a phase is a
moment of the step whose live tensors are listed below (the step's peak is in one of them). Each phase gives
a linear inequality in s, so the longest s is a division per phase; the smallest wins. Host memory (per node)
is solved the same way (host terms alive the whole step + the largest host phase: the forward/backward, which
holds the offloaded checkpoints, or the optimizer step). S is rounded down to a multiple of
``lcm(easy_context.seq_multiple(mode, W), 1024)``.

Model shape and parameters (``P``): hidden h, layers L, q heads n_h, K/V heads n_kv, head_dim d (q width
qd = n_h d, K/V width kvd = n_kv d), intermediate i, vocab V. Per layer: q, k, v, o projections
(``2 h qd + 2 h kvd``, + q/k/v biases for Qwen2), gated MLP ``3 h i``, two RMSNorms ``2 h``; plus the input
embedding ``V h``, the LM head ``V h`` (unless tied) and the final norm ``h`` (the conventions of
:func:`easy_context.flops.non_embedding_params`, plus embeddings and norms).

Activation units (bytes per local token): A = 2h (one bf16 hidden-size tensor), Q = 2 qd, K = 2 kvd (one of K
or V), M = 2i (one bf16 MLP intermediate), LSE = 4 n_h (fp32 log-sum-exp), Qf = 4 qd (fp32 q-sized),
Kr = r K where r is the K/V head replication of Ulysses (``W / n_kv`` when n_kv < Ulysses degree, else 1).

Model states (``--optim``):

- ``zero3_offload`` (default; ``accelerate_configs/zero3_offload.json``: DeepSpeed ZeRO-3, optimizer AND
  parameters offloaded to pinned host memory). GPU: only what ZeRO-3 gathers: parameters kept live up to
  ``stage3_max_live_parameters`` = 1e9 (the recipe's value; with ``stage3_max_reuse_distance`` = 1e9 the last
  layers' parameters stay gathered from the forward into the backward), counted as 2 B x min(1e9, layer
  params); the layer's bf16 gradients before reduce-scatter (2 B x one layer's params, backward phases only);
  the reduce bucket (``reduce_bucket_size`` "auto" = h^2 elements, bf16); parameters under the persistence
  threshold (10 h: the norms, and the biases) kept whole; the LM head / embedding gathered (and their bf16
  gradient) in the loss / embedding-backward phases. Host (divided over all N ranks, a node holding its
  G processes' share): fp32 master 4 + Adam m 4 + v 4 = 12 B/param, the fp32 gradient partition DeepSpeed's
  CPU Adam reads (4 B/param) and the bf16 parameter partition (2 B/param): 18 B/param.
- ``zero3_offload_optimizer``: as above, but the bf16 parameter partition (2P/N) stays on the GPU (16 B/param
  on host).
- ``zero3``: nothing offloaded; per GPU bf16 params 2P/N + bf16 grad partition 2P/N + fp32 master/m/v 12P/N,
  + the gathered working set above; at the optimizer step a transient fp32 gradient of one sub-group
  (4 B x min(P/N, sub_group_size 1e9)).
- ``ddp``: replicated (DDP-style, no sharding): 2P + 2P + 12P = 16 B/param on every GPU, the gradients counted
  for the whole step (an upper bound); the optimizer step adds one fp32 parameter-sized temporary (4P: torch's
  foreach AdamW intermediates, rough).
- ``host_adamw`` (:class:`easy_context.host_adamw.HostAdamW`, what ``bench/max_context.py`` runs; replicated,
  each process holds everything). GPU: the bf16 parameters (2P, persistent) and their bf16 gradients, counted
  per phase because they accumulate through the backward (``zero_grad(set_to_none=True)`` frees them after the
  step): at the first layer the backward reaches (L-1) those of the LM head, the final norm and that layer
  (2 (V h + h + layer params)); at the last layer (0) all but the input embedding's (2 (P - V h); tied: 2P);
  in the embedding backward and the optimizer step all of them (2P); in the loss phase the chunked loss's
  fp32 LM-head accumulator and its bf16 cast, which becomes the LM head's gradient (6 V h). No ZeRO working
  set, no GPU temporaries at the step (it goes tensor by tensor through the host). Host, per process: fp32
  master + Adam m, v (12P, allocated before the first step: the steady state), two pinned staging buffers of the
  largest tensor (bf16 gradient and bf16 parameter: 2 x 2 B x V h, each rounded up to a power of two by the
  pinned allocator unless ``--no-pinned-pow2``), and in the optimizer-step host phase the fp32 upcast of one
  gradient (4 B x V h; the offloaded checkpoints are freed by then).

Memory options (``--options``; a configuration is ``full``, ``offload`` or ``offload-split``, then ``+tiled``,
``+chunked``): where the checkpointed layer inputs (one s x h bf16 tensor per layer, A per token) live:

- ``full``: all L on the GPU.
- ``offload``: all L in pinned host memory (PyTorch's pinned allocator rounds each block up to a power of two
  unless ``pinned_max_round_threshold`` is set: ``--no-pinned-pow2`` counts exact bytes); a layer's input comes
  back to the GPU for its recompute only (freed after it: no saved tensor of the recomputed layer refers to it).
- ``offload-split`` (``bench/max_context.py --offload-layers auto``, ``enable_offloaded_checkpointing(model,
  offload_layers=k, pin_memory=False)``): the inputs of the FIRST k layers in pageable host memory (exact
  bytes), those of the last L - k on the GPU, k = min(L, floor(free / (s x h x 2 B))) with free = host memory -
  everything else the host holds in the forward/backward (runtime reserve, model states, staging buffers).
  The longest S is the best over k = L .. 0 (linear in s for each k): once the host is full, each further
  token costs the L - k resident inputs on the GPU, (L - k) A per token, a slope that grows as k drops.
  ``--offload-layers K`` fixes k for the breakdown.
- ``+tiled``: tiled MLP (``--mlp-tiles auto``: tiles of h tokens, ALST's choice; ``--mlp-tiles T``: T tiles;
  ``--mlp-tile-tokens N``: tiles of N tokens, ``enable_tiled_mlp(model, tile_tokens=N)``).
- ``+chunked``: chunked linear cross-entropy (``--loss-chunk``, 1024).

``--checkpoint-every K`` (``train.py --checkpoint-every K``, :mod:`easy_context.memory.strided_checkpoint`):
only ceil(L/K) layer inputs are checkpointed (L above becomes ceil(L/K) for every configuration, the split's k
included); in the backward of a group of K layers its K-1 regenerated inputs are on the GPU: the layer's own
(where x comes back from the host it is counted already) and those waiting for their recompute, so (K-1) A or
(K-2) A more per token in the layer phases ("@ layer 0": the moment of the group's last layer, near the end of
the backward). Not validated on a GPU yet (CPU tests check the stored and regenerated tensors).

RMSNorm (``--norm``): every Llama-style decoder layer has two, the input norm (its input is the layer input x,
alive anyway as the checkpoint or the recompute input) and the post-attention norm (its input h1 = x + attn out),
plus the final norm before the LM head. Per (s, h) norm:

- ``eager`` (default; transformers' ``LlamaRMSNorm.forward``, what every measured probe ran): autograd saves
  the fp32 upcast of the input (2A), the bf16 normalized x_hat (A) and the fp32 rstd (4 B per token), so the
  bf16 input itself is not kept (h1 is freed after the forward); the output is bf16 (A). Its backward holds
  5 fp32 (s, h) temporaries at once (10A; in ``pow``'s backward, see ``norm bwd``) next to the fp32 copy.
- ``chunked`` (``enable_chunked_rmsnorm``: :class:`easy_context.memory.rmsnorm.RMSNormFunction`): saves its
  input by reference (the input norm: x, no new bytes; the post-attention norm: h1, which now stays alive, A;
  the final norm: the last layer's output, A) and the fp32 rstd (4 B); the output is bf16 (A). Its backward
  allocates its input gradient dx whole (bf16, A) and the fp32 weight-gradient accumulator (4 h B), then walks
  the rows in chunks of 4096: its fp32 temporaries are a fixed ~5 x 4096 x h x 4 B (4.5 counted op by op;
  0.34 GB at h = 4096), whatever s; its incoming gradient (A) stays alive through it. Its forward works on the
  same chunks (~3 x 4096 x h x 4 B transient, below any phase). This model is a prediction from the code, not
  yet validated on a GPU (``bench/max_context.py --chunked-rmsnorm`` probes would be: ``--validate`` reads the
  flag from a probe's command). Qwen3's per-head q/k norms, which ``enable_chunked_rmsnorm`` patches too, are in
neither model (see "Not modelled").

Persistent GPU tensors (the whole step): CUDA context (``--cuda-reserve``, 1.5 GB) and NCCL buffers (0.5 GB
when W > 1), both outside the caching allocator; input ids, labels, position ids (3 x int64 = 24 B/token);
RoPE cos and sin (bf16, 4 d B/token); the GPU-resident model states of ``--optim``.

Phases (tensors alive at the same time; "x" = the layer input, "dy" = the gradient arriving from above). The
layer phases are those of the first layer the backward reaches (L-1), which holds every GPU-resident
checkpoint (``full``: L x A, ``offload-split``: (L - k) x A, x being one of them; ``offload``: none, x comes
back for the recompute); the ``loss`` phase holds them too. With ``host_adamw`` the gradients grow while the
checkpoints are consumed, so the same phases at the last layer (``... @ layer 0``: no checkpoint on the GPU
unless ``full``, nearly all gradients) are moments of their own; the per-layer bytes vary linearly between the
two, so the peak is at one of them.

- ``attn fwd`` (recompute of one layer, in the attention kernel): x (offloaded layers: back on the GPU, A), dy (A),
  what the input RMSNorm saves (eager: ``x.float()``: 2A, the bf16 normalized x_hat: A, fp32 rstd: 4 B; chunked: x
  by reference and rstd: 4 B) and its output n1 (A), q, k, v after RoPE (Q + 2K; RoPE saves only cos/sin, the
  pre-RoPE projections are freed), and the attention forward buffers of the mode: ring (zigzag, dist_flash, the ring
  part of usp): the stacked K/V copy (2 Kr) and the K/V in flight (2 Kr, when ring degree > 1), fp32 output + LSE
  accumulators (Qf + LSE), one block's kernel out + lse (Q + LSE); dist_flash also a borrowed q (Q) and a helper's
  partial fp32 out + lse (Qf + LSE); local kernel (data_parallel, ulysses): out + lse (Q + LSE); Ulysses (ulysses,
  usp): the all-to-all copies q', k', v' (Q + 2 Kr, input and output of the exchange both alive) and the replicated
  K/V before the exchange (2 Kr when r > 1).
- ``mlp bwd`` (backward of the recomputed layer's MLP): dy (A), everything the attention half saved: input norm
  (eager 3A + 4 B, chunked 4 B) and n1 (A), attention saved tensors (q, k, v, out -- out is also o_proj's saved
  input, same storage: 2Q + 2K + LSE; Ulysses: q', k', v', out' and the gathered-back out: 3Q + 2Kr + LSE), what the
  post norm saved (eager: fp32 copy of h1 = x + attn and bf16 h1_hat, 3A + 4 B, h1 itself is freed; chunked: h1
  itself and rstd, A + 4 B), n2 (A); the MLP ``down(silu(gate(n2)) * up(n2))``: saved gate, up, silu(gate), product
  (4M) + at the product's backward d(product), d(silu), d(up) minus the freed product (2M more): 6M untiled. Tiled
  MLP (``easy_context.memory.tiled_mlp``): one tile's 6M (6 x tile x i x 2 B), its input gradient d n2 allocated
  whole up front (A), and the fp32 gradient accumulators of the MLP weights (3 h i x 4 B). Gather modes: the layer's
  bf16 parameter gradients (2 B x layer params).
- ``norm bwd`` (backward of the post-attention RMSNorm): the attention half's saved tensors as above, dy (A), and:
  eager (with a tiled MLP the largest moment of a layer, the peak of every measured probe): the norm's saved fp32 h1
  copy + rstd (2A + 4 B) and the fp32 temporaries of HF's eager RMSNorm autograd graph, 5 x 2A = 10A alive at once
  (in ``pow``'s backward: the gradient through ``x * rstd`` waiting to be summed, the mean's expanded gradient,
  ``x.pow(1)``, ``2 x`` and their product; measured op by op on CPU with a scaled model; its incoming gradient d n2
  and the bf16 h1_hat are consumed by then); chunked: h1 + rstd (A + 4 B), its incoming gradient d n2 (A), its dx
  (A) and the fixed chunk temporaries + fp32 d weight -- the same bytes per token as ``mlp bwd`` with tiles of a
  fixed size, so a moment that only its fixed bytes can make the peak (for Llama 7B/8B: 0.34 GB against the MLP's 6M
  x tile + 12 h i, 1.6 .. 2.1 GB with 8192-token tiles; a tiny model's tiles can be smaller). The MLP's tensors are
  freed by then. The input norm's backward (after ``attn bwd``: the attention's saved tensors freed, x, d h1, d n1 +
  the same norm terms) is smaller in both models, so not a phase.
- ``attn bwd`` (backward of the distributed attention): input norm (eager 3A + 4 B, chunked 4 B), n1 (A), attention
  saved tensors, d h1 (A; it is also x's gradient through the residual, nothing else is accumulated yet), d out (Q);
  backward buffers: ring: stacked K/V + in flight (2 Kr + 2 Kr), fp32 dq accumulator (Qf), fp32 dK/dV travelling:
  current and in flight (4 Kr + 4 Kr), one block's kernel gradients (Q + 2 Kr), kernel workspace (fp32 dq
  accumulator and delta: Qf + LSE); dist_flash also borrowed q, dout, out + lse (3Q + LSE) and a partial fp32 dq
  (Qf); local kernel: gradients (Q + 2 Kr; under Ulysses these are dq', dk', dv') + workspace (Qf + LSE); with GQA
  (Kr < Q) the kernel's dK and dV per query head before each group is summed (2Q: cuDNN's and FA2's backward
  both do this; the H200 probe at 417,792 tokens confirmed it to 0.1 %); Ulysses:
  the exchanged d out' and the dq, dk, dv exchanged back (2Q + 2 Kr). Gather modes: the layer's bf16 parameter
  gradients.
- ``loss`` (first moment of the backward): what the final norm saved (eager 3A + 4 B; chunked: its input, the last
  layer's output, kept alive, and rstd: A + 4 B) and its output (A), d hidden (A); plain loss (HF: bf16 logits, fp32
  upcast, fp32 log-softmax): V x (2 + 4 + 4) B per token; chunked linear CE (``--loss chunked``, chunk 1024): 3 fp32
  (chunk, V) buffers (constant) + fp32 lse, int64 target, bool valid per token (13 B), and its fp32 LM-head gradient
  accumulator (4 B x V h, cast to bf16 at the end: + 2 B x V h); gather modes: the LM head gathered (2 B x V h) and,
  plain loss, its bf16 gradient. The final norm's own backward (eager 2A + 4 B + 10A; chunked A + 4 B + d out + dx +
  the chunk temporaries) is a subset of the top layer's ``norm bwd``, so not a phase.
- ``embedding bwd``: d embeddings (A), the CUDA embedding backward's fp32 per-segment partial sums (at most 2A)
  and, gather modes, the embedding weight gathered and its bf16 gradient.
- ``optimizer step``: no activations; the optimizer's transients (see ``--optim``).

The first (no-grad-saving) forward of each layer is a subset of ``attn fwd`` + an MLP forward (3M live at most,
less than the backward's 6M), so it is not a separate phase; so is the rest of the recompute (the tiled MLP's
forward runs again in it: ``TiledMLPFunction`` saves its input only after its forward).

Allocator and host:

- fragmentation / caching-allocator overhead: +10 % of everything the allocator holds (``--frag``);
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` is what keeps it near that (measured on an H200:
  reserved / allocated = 1.02 .. 1.11 at the peak, see "Validation"; 10 % is kept as the planning margin).
- host per node: the model states above, the offloaded checkpoints of the node's G processes (pinned or, with
  ``offload-split``, pageable), and a runtime reserve per process (``--host-reserve``, 3 GB: torch/CUDA/DeepSpeed
  libraries, the data loader; a bare ``bench/max_context.py`` process measured 1.6 .. 2.1 GiB).

Not modelled: micro-batch > 1 (multiply s), attention masks / padding, sliding windows,
``checkpoint_after_attention`` (+ Q + LSE per layer kept, less recompute), Liger/CCE fused losses, fused RMSNorm
kernels (e.g. Liger's: no 10A fp32 temporaries, roughly ``--norm chunked``), Qwen3's per-head q/k RMSNorms over
head_dim (in neither norm model; eager they would save 3Q + 3K + 4 (n_h + n_kv) B per token per layer and make fp32
q/k-sized temporaries in the backward, chunked the pre-norm q and k, Q + K, and the rstd; their weights, 2 d per
layer, are not in P either), compile/cuda-graph pools, loading spikes, the extra copies when an attention call is
split over heads (tensors past 2**31 elements: ``easy_context.kernels.base.head_groups``; the GQA dK/dV term then
shrinks to one call's heads), the efficient/math kernels' explicit K/V repetition to the query heads (the planner
assumes cuDNN or FA2, which read un-repeated K/V), ``HostAdamW``'s first
step with its state still unallocated (``--validate`` reports that case separately).

Validation (``python -m easy_context.plan --validate docs/results/h200_max_context.jsonl``)
-----------------------------------------------------------------------------------------
One H200 (139.8 GiB), torch 2.11, ``bench/max_context.py``: ``data_parallel``, cuDNN attention, ``host_adamw``,
``offload-split`` (k = the probe's own), tiles of 8192 tokens, chunked loss, the probe's RMSNorm (eager, or
``--chunked-rmsnorm``: chunked); GiB, measured / predicted:

==============  =======  ==  ===============  ===============  ==================  ====================
model           S        k   GPU allocated    GPU reserved     peak phase          host RSS (pred.)
==============  =======  ==  ===============  ===============  ==================  ====================
Llama-3-8B      65,536   32  38.71 / 38.73    41.51 / 42.60    norm bwd @ layer 0  95.81 / 96.50 (lazy)
Llama-3-8B      131,072  26  48.50 / 48.52    53.76 / 53.37    norm bwd @ layer 0  95.85 / 96.50 (lazy)
Llama-3-8B      262,144  12  95.49 / 95.51    98.80 / 105.06   norm bwd            95.82 / 96.50 (lazy)
Llama-2-7B      262,144  20  79.27 / 79.34    80.63 / 87.27    norm bwd            116.92 / 118.60
Llama-3-8B (c)  417,792  8   128.23 / 128.21  130.55 / 141.04  attn bwd            116.96 / 120.04
==============  =======  ==  ===============  ===============  ==================  ====================

(c): chunked RMSNorm. This probe is 99.5 % of the planner's longest context for its setting (419,840 tokens).
Before it, the planner missed 6.4 GiB at its attention-backward peak: one (s, 2 x q_dim) bf16 pair, cuDNN's
dK and dV per query head before the GQA group sum (cudnn-frontend's SDPA backward graph builds them as
``dK_fullhead`` / ``dV_fullhead``; FA2's backward allocates the same ``dk_expanded`` / ``dv_expanded``). The
eager-norm probes never peaked there.

Nothing was fitted: the allocated peak is the sum of the terms above (within 0.1 %); reserved is predicted as
allocated x 1.10 (``--frag``), within -1 % .. +8 %. Without the ``norm bwd`` phase the planner was 4 % .. 15 %
under the allocated peaks (its largest phase then ``mlp bwd`` / ``attn bwd``). The 8B probes allocated the optimizer's
host state lazily, at the step: their host peak is the optimizer step (12P + staging + fp32 upcast + runtime;
"lazy"); the 7B probe allocated it before the step, so its peak is the steady state (12P + staging + the k
offloaded checkpoints + runtime) that the planner uses. The host runtime reserve (3 GB) is about 1 GiB above
what these processes used.

Sanity anchors (published; not fitted -- ``python -m easy_context.plan --model llama-3-8b --anchors`` prints them):

=====================================================  =========  ==========================  =========================
setting (planner mode, option set)                     published  eager norm (bound)          chunked norm (bound)
=====================================================  =========  ==========================  =========================
ALST Llama-3-8B, 1x H100 80 GiB, host 1 TB (dp, all)   500K       462,848 (GPU, norm bwd)     816,128 (GPU, attn bwd)
ALST Llama-3-8B, 1x H200 141 GB, host 2 TB (dp, all)   1.2M       774,144 (GPU, norm bwd)     1,367,040 (GPU, attn bwd)
ALST Llama-3-8B, 8x H100 80 GiB, host 2 TB (ulysses)   3.7M       3,501,056 (GPU, norm bwd)   4,194,304 (host)
EasyContext Llama-2-7B, 8x A100 80 GiB (zigzag,        700K       1,631,232 (GPU, loss)       1,708,032 (GPU, loss)
offload, plain logits)
=====================================================  =========  ==========================  =========================

With the eager norm (what our H200 stack validated) the ALST numbers land within -35 % .. -5 %: its backward's 10A
of fp32 temporaries bound every ALST row. ALST's stack may use fused kernels for it (e.g. Liger's), and differs in
the attention working set (their Ulysses + FA2 path); their lengths are round numbers from runs, not searched
maxima. Without the RMSNorm temporaries (but with eager's saved fp32 copies) this model gave 600K / 1.0M / 3.87M;
with the chunked norm (none of either; validated at 417,792 tokens on one H200) +63 % / +14 % / +13 % over them,
bounded by the attention backward (1 GPU) or by the 8 ranks' pinned checkpoints, each rounded up to a power of two,
on the 2 TB host (8 GPUs). EasyContext's 700K is the length it demonstrated, not a searched limit; its stack
(transformers 4.3x upcasting the full logits to fp32 inside the model on top of the loss's own fp32 copies,
ring-flash-attn's per-step fp32 buffers, no ``expandable_segments``) holds more per token than counted here, so the
planner's 1.63M is an upper bound for that stack (same order of magnitude).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass

from . import cli, registry
from .layout import Layout

GB = 1e9
MODES = registry.SEQ_ALGOS  # the built-in backends; the planner takes every registered one (registry.SEQ_ALGOS)
OPTIMS = ("zero3_offload", "zero3_offload_optimizer", "zero3", "ddp", "host_adamw")
OPTIM_CONFIGS = {  # how each --optim is launched, for {gpus} processes
    "zero3_offload": "accelerate launch --config_file accelerate_configs/single_node.yaml --num_processes {gpus}",
    "zero3_offload_optimizer": "a ZeRO-3 config like accelerate_configs/zero3_offload.json without offload_param",
    "zero3": "a ZeRO-3 config like accelerate_configs/zero3_offload.json without offloading",
    "ddp": "accelerate launch --multi_gpu --num_processes {gpus}",
    "host_adamw": "accelerate launch --multi_gpu --num_processes {gpus}",
}
MAX_LIVE_PARAMETERS = 1e9  # stage3_max_live_parameters in accelerate_configs/zero3_offload.json
SUB_GROUP_SIZE = 1e9  # sub_group_size in the same file
LOSS_CHUNK = 1024  # easy_context.loss.chunked_ce.DEFAULT_CHUNK_SIZE
NORMS = ("eager", "chunked")  # transformers' eager RMSNorm, easy_context.memory.enable_chunked_rmsnorm
NORM_CHUNK_ROWS = 4096  # easy_context.memory.rmsnorm.CHUNK_ROWS
NORM_CHUNK_TEMPS = 5  # fp32 (chunk, h) temporaries alive at once in RMSNormFunction.backward (4.5 counted op by op)
ROUND_TOKENS = 1024

# The published shapes of these models (their config.json on the hub), for offline use.
BUILTIN_MODELS: dict[str, dict] = {
    "llama-2-7b": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, intermediate_size=11008, vocab_size=32000),
    "llama-3-8b": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, intermediate_size=14336, vocab_size=128256),
    "llama-3-70b": dict(model_type="llama", hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                        num_key_value_heads=8, intermediate_size=28672, vocab_size=128256),
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, intermediate_size=14336, vocab_size=32000),
    "qwen2-7b": dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, intermediate_size=18944, vocab_size=152064),
}  # fmt: skip
ALIASES = {"llama-2-7b-hf": "llama-2-7b", "meta-llama-3-8b": "llama-3-8b", "llama-3.1-8b": "llama-3-8b",
           "meta-llama-3.1-8b": "llama-3-8b", "meta-llama-3-70b": "llama-3-70b", "llama-3.1-70b": "llama-3-70b",
           "meta-llama-3.1-70b": "llama-3-70b", "mistral-7b-v0.1": "mistral-7b", "qwen2.5-7b": "qwen2-7b"}  # fmt: skip


# ---------------------------------------------------------------------------------------------------- inputs
def parse_size(text: str | float | int) -> float:
    """Bytes of "80GB" (1e9), "512GiB" (2**30), "1TB", "1.5T", "2048MiB"; a bare number is GB."""
    if isinstance(text, (int, float)):
        return float(text) * GB
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGTP]?)(I?)B?\s*", text.upper())
    if not m:
        raise ValueError(f"cannot parse size {text!r} (examples: 80GB, 141GB, 1TB, 512GiB)")
    value, prefix, binary = float(m.group(1)), m.group(2) or "G", bool(m.group(3))
    power = "KMGTP".index(prefix) + 1
    return value * (1024**power if binary else 1000**power)


@dataclass
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False

    @classmethod
    def from_config(cls, name: str, cfg: dict) -> ModelShape:
        cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
        h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        model_type = cfg.get("model_type", "")
        return cls(
            name=name,
            hidden=h,
            layers=cfg["num_hidden_layers"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or h // heads,
            intermediate=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", False)) or model_type == "qwen2",
        )

    @property
    def qd(self) -> int:
        return self.heads * self.head_dim

    @property
    def kvd(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def small_params_per_layer(self) -> int:
        """Norm weights and biases: below ZeRO-3's persistence threshold (10 h), kept whole on every GPU."""
        return 2 * self.hidden + ((self.qd + 2 * self.kvd) if self.qkv_bias else 0)

    @property
    def layer_params(self) -> int:
        h = self.hidden
        return 2 * h * self.qd + 2 * h * self.kvd + 3 * h * self.intermediate + self.small_params_per_layer

    @property
    def params(self) -> int:
        embed = self.vocab * self.hidden
        return self.layers * self.layer_params + embed * (1 if self.tied else 2) + self.hidden

    @property
    def largest_param(self) -> int:
        """Elements of the largest parameter tensor (the embedding / LM head for every supported model)."""
        h = self.hidden
        return max(self.vocab * h, self.intermediate * h, self.qd * h)


def load_model_shape(spec: str, vocab_size: int | None = None) -> ModelShape:
    """A config.json path (or a folder holding one), a built-in hub-like name (``shape:`` prefix allowed), a preset,
    or a cached hub config."""
    if os.path.isdir(spec) and os.path.isfile(os.path.join(spec, "config.json")):
        spec = os.path.join(spec, "config.json")
    if os.path.isfile(spec):
        with open(spec) as f:
            cfg = json.load(f)
        if vocab_size:
            cfg["vocab_size"] = vocab_size
        return ModelShape.from_config(spec, cfg)
    key = spec.lower().removeprefix("shape:").rstrip("/").split("/")[-1]  # shape:<name>: the bench/train.py spelling
    for suffix in ("-hf", "-instruct", "-chat"):
        key = key.removesuffix(suffix)
    key = ALIASES.get(key, key)
    if key in BUILTIN_MODELS:
        cfg = dict(BUILTIN_MODELS[key], **({"vocab_size": vocab_size} if vocab_size else {}))
        return ModelShape.from_config(key, cfg)
    from .models import PRESETS

    if spec in PRESETS:
        model_type, overrides = PRESETS[spec]
        cfg = dict(overrides, model_type=model_type, vocab_size=vocab_size or 32000)
        return ModelShape.from_config(spec, cfg)
    try:  # a hub config already in the local cache (never downloads)
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(spec, local_files_only=True).to_dict()
        return ModelShape.from_config(spec, cfg)
    except Exception:
        pass
    raise ValueError(
        f"unknown model {spec!r}: give a config.json path, one of {sorted(BUILTIN_MODELS)} or a preset "
        f"{sorted(PRESETS)} (no hub downloads)"
    )


CHECKPOINTING = ("full", "offload", "offload-split")


@dataclass(frozen=True)
class MemOption:
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


@dataclass
class Setup:
    gpus: int
    gpu_mem: float
    host_mem: float
    gpus_per_node: int | None = None
    sp_size: int | None = None  # W; default all GPUs
    optim: str = "zero3_offload"
    mlp_tiles: int | None = None  # None: tiles of h tokens (ALST) unless mlp_tile_tokens; else a fixed tile count
    mlp_tile_tokens: int | None = None  # tiles of this many tokens (enable_tiled_mlp(model, tile_tokens=...))
    loss_chunk: int = LOSS_CHUNK
    frag: float = 0.10
    cuda_reserve: float = 1.5 * GB
    nccl_reserve: float = 0.5 * GB
    host_reserve: float = 3 * GB  # per process
    pinned_pow2: bool = True
    ring_degree: int | None = None  # usp_attn; None: the repo's default, else the next feasible
    norm: str = "eager"  # RMSNorm autograd: "eager" (transformers') or "chunked" (enable_chunked_rmsnorm)
    checkpoint_every: int = 1  # keep every K-th layer input, regenerate the others (strided_checkpoint)

    def __post_init__(self):
        if self.optim not in OPTIMS:
            raise ValueError(f"optim must be one of {OPTIMS}, got {self.optim!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        self.gpus_per_node = self.gpus_per_node or min(self.gpus, 8)
        self.sp_size = self.sp_size or self.gpus
        if self.gpus % self.sp_size:
            raise ValueError(f"sp_size {self.sp_size} must divide the number of GPUs {self.gpus}")
        if self.mlp_tiles is not None and self.mlp_tile_tokens is not None:
            raise ValueError("give mlp_tiles (a tile count) or mlp_tile_tokens (tokens per tile), not both")
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be an integer >= 1, got {self.checkpoint_every!r}")

    def stored_inputs(self, layers: int) -> int:
        """How many layer inputs are checkpointed: one per group of ``checkpoint_every`` layers."""
        return -(-layers // self.checkpoint_every)

    @property
    def procs_per_node(self) -> int:
        return min(self.gpus, self.gpus_per_node)


# ---------------------------------------------------------------------------------------------------- the model
@dataclass
class Term:
    """``fixed + per_token * s`` bytes, s = tokens on one rank."""

    name: str
    fixed: float = 0.0
    per_token: float = 0.0

    def at(self, s: float) -> float:
        return self.fixed + self.per_token * s


def mode_layout(mode: str, shape: ModelShape, setup: Setup) -> Layout:
    """The backend's own layout on the SP size. Its options set in ``setup`` (a field of the option's name, e.g.
    ``ring_degree``) are taken as given; those left open are searched (``SeqAlgo.option_choices``): the backend's
    default first, then every other choice, the first one the heads allow."""
    algo = registry.get_seq_algo(mode)
    given = {name: getattr(setup, name, None) for name in algo.options}
    feasible = algo.feasible_layouts(setup.sp_size, shape.heads, shape.kv_heads, **given)
    return next(feasible, None) or algo.layout(setup.sp_size, shape.heads, shape.kv_heads, **given)


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


def _pinned(nbytes: float, pow2: bool) -> float:
    """Bytes PyTorch's pinned host allocator takes for a block of ``nbytes`` (rounded up to a power of two)."""
    return 2 ** math.ceil(math.log2(nbytes)) if pow2 and nbytes > 0 else nbytes


def build_budget(
    shape: ModelShape, setup: Setup, mode: str, option: MemOption, offload_layers: int | None = None
) -> Budget:
    """The terms of one step for ``mode`` and ``option`` (see the module docstring for what each one counts).

    ``offload_layers`` (``offload-split`` only): how many layer inputs (the first ones) are offloaded, the others
    staying on the GPU; default all (use :func:`split_offload_layers` for the number the host holds at a length).
    """
    lay = mode_layout(mode, shape, setup)
    h, L, i, V, d = shape.hidden, shape.layers, shape.intermediate, shape.vocab, shape.head_dim
    A, Q, K, M = 2 * h, 2 * shape.qd, 2 * shape.kvd, 2 * i
    LSE, Qf = 4 * shape.heads, 4 * shape.qd
    Kr = lay.kv_rep * K
    P, N, G = shape.params, setup.gpus, setup.procs_per_node
    lp = shape.layer_params
    host_adamw = setup.optim == "host_adamw"
    gather = setup.optim not in ("ddp", "host_adamw")
    split = option.checkpointing == "offload-split"
    stored = setup.stored_inputs(L)  # checkpointed layer inputs (L unless checkpoint_every > 1)
    if option.checkpointing == "full":
        k = 0
    elif option.checkpointing == "offload" or offload_layers is None:
        k = stored
    else:
        k = int(offload_layers)
        if not 0 <= k <= stored:
            raise ValueError(f"offload_layers must be in 0..{stored}, got {offload_layers}")
    resident = stored - k  # layer inputs kept on the GPU: those of the LAST stored - k groups
    ring = lay.blockwise
    uly = lay.ulysses > 1

    reserve = [Term("CUDA context + cuBLAS/cuDNN workspaces", setup.cuda_reserve)]
    if setup.gpus > 1:
        reserve.append(Term("NCCL communicator buffers", setup.nccl_reserve))

    # model states on the GPU
    pers: list[Term] = []
    if setup.optim == "ddp":
        pers += [Term("bf16 params (2P, replicated)", 2 * P), Term("bf16 grads (2P, replicated)", 2 * P),
                 Term("fp32 master + Adam m, v (12P, replicated)", 12 * P)]  # fmt: skip
    elif host_adamw:
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
    pers.append(Term("RoPE cos/sin (bf16)", per_token=4 * d))

    # checkpointed layer inputs on the GPU: at the first layer the backward reaches (L-1) and at the last (0)
    top_ckpt = [Term(f"layer-input checkpoints on GPU ({resident} of {stored} x s x h x 2 B)", per_token=resident * A)]
    top_ckpt = top_ckpt if resident else []
    x_back = Term("layer input x back on GPU (recompute)", per_token=A)
    top_x = [] if resident else [x_back]
    bottom_ckpt = [Term("layer 0's input checkpoint on GPU", per_token=A)] if resident == stored else []
    bottom_x = [] if resident == stored else [x_back]
    # strided checkpointing: in a group's backward, the layer's own input is a regenerated one (counted already
    # where x comes back from the host), and the inputs of the group's earlier layers wait for their recompute
    group = min(setup.checkpoint_every, L)

    def regenerated(own_counted: bool) -> list[Term]:
        n = group - 1 - own_counted
        return [Term(f"regenerated layer inputs of one group ({n} x s x h x 2 B)", per_token=n * A)] if n > 0 else []

    regen_top = regenerated(own_counted=bool(top_x)) if group > 1 else []
    regen_bottom = regenerated(own_counted=bool(bottom_x)) if group > 1 else []

    # gradients alive in the layer phases
    if gather:
        grads_top = grads_bottom = [Term("layer bf16 param grads before reduce-scatter", 2 * lp)]
    elif host_adamw:
        head = V * h  # the LM head (the tied embedding when tied)
        grads_top = [Term("bf16 grads so far: LM head, final norm, this layer", 2 * (head + h + lp))]
        grads_bottom = [Term("bf16 grads so far: all but the input embedding", 2 * (P - (0 if shape.tied else head)))]
    else:  # ddp: persistent
        grads_top = grads_bottom = []

    if uly:
        attn_saved = Term(
            "attention saved: q', k', v', out' (all-to-all copies), out, lse", per_token=3 * Q + 2 * Kr + LSE
        )
    else:
        attn_saved = Term("attention saved: q, k, v, out, lse", per_token=2 * Q + 2 * K + LSE)

    # RMSNorm (see "RMSNorm"): eager saves fp32 copies and its backward makes 5 fp32 (s, h) temporaries; chunked
    # saves its input by reference + fp32 rstd, its backward works on (NORM_CHUNK_ROWS, h) fp32 chunks
    chunked_norm = setup.norm == "chunked"
    norm_temps = Term(f"chunked RMSNorm backward fp32 temporaries ({NORM_CHUNK_TEMPS} x {NORM_CHUNK_ROWS} x h x 4 B)"
                      " + fp32 d weight", NORM_CHUNK_TEMPS * NORM_CHUNK_ROWS * h * 4 + 4 * h)  # fmt: skip

    # attn fwd (recompute)
    if chunked_norm:  # its input is x (the checkpoint / recompute input), counted already
        norm1 = [Term("input norm saved: fp32 rstd (x by reference)", per_token=4)]
    else:
        norm1 = [Term("input norm saved: fp32 x copy + bf16 x_hat + fp32 rstd", per_token=3 * A + 4)]
    norm1.append(Term("n1 = input norm output", per_token=A))
    dy = Term("dy (grad from the layer above)", per_token=A)
    fwd = norm1 + [dy, Term("q, k, v", per_token=Q + 2 * K)]
    if uly:
        fwd.append(Term("Ulysses all-to-all copies q', k', v'", per_token=Q + 2 * Kr))
        if lay.kv_rep > 1:
            fwd.append(Term(f"K/V replicated x{lay.kv_rep} before all-to-all", per_token=2 * Kr))
    if ring:
        fwd.append(Term("ring: stacked K/V copy", per_token=2 * Kr))
        if lay.ring > 1:
            fwd.append(Term("ring: K/V in flight", per_token=2 * Kr))
        fwd.append(Term("ring: fp32 out + lse accumulators", per_token=Qf + LSE))
        fwd.append(Term("ring: one block's kernel out + lse", per_token=Q + LSE))
        if lay.borrows_queries:
            fwd.append(Term("dist_flash: borrowed q + helper's fp32 partial out, lse", per_token=Q + Qf + LSE))
    else:
        fwd.append(Term("kernel out + lse", per_token=Q + LSE))

    common = norm1 + [attn_saved]
    # mlp bwd
    if chunked_norm:  # h1 = x + attn out, kept alive by the norm (eager frees it: it saves an fp32 copy)
        post_saved = Term("post norm saved: h1 (bf16, by reference) + fp32 rstd", per_token=A + 4)
    else:
        post_saved = Term("post norm saved: fp32 h1 copy + bf16 h1_hat + fp32 rstd", per_token=3 * A + 4)
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

    # norm bwd: backward of the post-attention RMSNorm
    if chunked_norm:  # its incoming gradient d n2 and its output dx are whole (s, h) bf16 tensors
        norm = common + [dy, post_saved, Term("d n2 (the norm's incoming gradient)", per_token=A),
                         Term("chunked RMSNorm dx (allocated whole)", per_token=A), norm_temps]  # fmt: skip
    else:  # HF eager: fp32 autograd temporaries
        norm = common + [dy, Term("post norm saved: fp32 h1 copy + fp32 rstd", per_token=2 * A + 4),
                         Term("eager RMSNorm backward fp32 temporaries (5 x s x h x 4 B)",
                              per_token=10 * A)]  # fmt: skip

    # attn bwd
    bwd = common + [
        Term("d h1 (the residual gradient, also the layer input's)", per_token=A),
        Term("d out", per_token=Q),
    ]
    if uly:
        bwd.append(Term("Ulysses: exchanged d out' + dq, dk, dv exchanged back", per_token=2 * Q + 2 * Kr))
    if ring:
        bwd.append(Term("ring: stacked K/V copy" + (" + in flight" if lay.ring > 1 else ""),
                        per_token=2 * Kr * (2 if lay.ring > 1 else 1)))  # fmt: skip
        bwd.append(Term("ring: fp32 dq accumulator", per_token=Qf))
        bwd.append(Term("ring: fp32 dK/dV travelling" + (" + in flight" if lay.ring > 1 else ""),
                        per_token=4 * Kr * (2 if lay.ring > 1 else 1)))  # fmt: skip
        bwd.append(Term("one block's kernel dq, dk, dv", per_token=Q + 2 * Kr))
        if lay.borrows_queries:
            bwd.append(Term("dist_flash: borrowed q, dout, out, lse + fp32 partial dq", per_token=3 * Q + LSE + Qf))
    else:
        bwd.append(Term("kernel dq, dk, dv", per_token=Q + 2 * Kr))
    bwd.append(Term("kernel workspace (fp32 dq accum + delta)", per_token=Qf + LSE))
    if Kr < Q:  # GQA: cuDNN and FA2 compute dK, dV per query head, then sum each group (measured on the H200)
        bwd.append(Term("kernel GQA: dK, dV at the query heads before the group sum", per_token=2 * Q))

    phases = {
        "attn fwd": top_ckpt + top_x + regen_top + fwd + ([] if gather else grads_top),  # ZeRO: the grads come later
        "mlp bwd": top_ckpt + regen_top + mlp + grads_top,
        "norm bwd": top_ckpt + regen_top + norm + grads_top,
        "attn bwd": top_ckpt + regen_top + bwd + grads_top,
    }
    if host_adamw:  # the gradients grow through the backward: the last layer (0) is a moment of its own
        phases |= {
            "attn fwd @ layer 0": bottom_ckpt + bottom_x + regen_bottom + fwd + grads_bottom,
            "mlp bwd @ layer 0": bottom_ckpt + regen_bottom + mlp + grads_bottom,
            "norm bwd @ layer 0": bottom_ckpt + regen_bottom + norm + grads_bottom,
            "attn bwd @ layer 0": bottom_ckpt + regen_bottom + bwd + grads_bottom,
        }

    # loss
    if chunked_norm:
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
    if gather:
        loss.append(Term("LM head gathered (bf16)", 2 * V * h))
    emb = [Term("d embeddings output", per_token=A),
           Term("embedding backward: fp32 per-segment partial sums (<= 2A)", per_token=2 * A)]  # fmt: skip
    if gather:
        emb.append(Term("embedding gathered + bf16 grad", 4 * V * h))
    elif host_adamw:
        emb.append(Term("bf16 grads (2P)", 2 * P))

    phases |= {"loss": loss, "embedding bwd": emb}
    if setup.optim == "zero3":
        phases["optimizer step"] = [Term("fp32 grad of one sub-group", 4 * min(P / N, SUB_GROUP_SIZE))]
    elif setup.optim == "ddp":
        phases["optimizer step"] = [Term("foreach AdamW fp32 temporaries (~4P)", 4 * P)]
    elif host_adamw:
        phases["optimizer step"] = [Term("bf16 grads (2P)", 2 * P)]
    else:
        phases["optimizer step"] = []

    # host, per node
    host = [Term(f"runtime reserve ({G} processes)", G * setup.host_reserve)]
    share = G / N
    if setup.optim in ("zero3_offload", "zero3_offload_optimizer"):
        host.append(Term("fp32 master + Adam m, v (12 B/param, node share)", 12 * P * share))
        host.append(Term("fp32 grad partition for CPU Adam (4 B/param)", 4 * P * share))
    if setup.optim == "zero3_offload":
        host.append(Term("bf16 param partition (2 B/param)", 2 * P * share))
    step_host: list[Term] = []
    if host_adamw:
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
    host_phases = {"forward/backward": ckpt_host, "optimizer step": step_host}
    return Budget(lay, option, reserve, pers, phases, host, host_phases, setup.frag, pow2_tensors, A, k, stored)


# ---------------------------------------------------------------------------------------------------- the solve
@dataclass
class Prediction:
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
    """Longest S with GPU bytes <= gpu_mem on every phase and host bytes <= host_mem (see the module docstring).

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


# ---------------------------------------------------------------------------------------------------- anchors
ANCHORS = (
    # (label, model, gpus, gpu_mem, host_mem, mode, option, published S)
    ("ALST Llama-3-8B 1x H100-80GB", "llama-3-8b", 1, "80GiB", "1TB", "data_parallel", "offload+tiled+chunked",
     500_000),
    ("ALST Llama-3-8B 1x H200", "llama-3-8b", 1, "141GB", "2TB", "data_parallel", "offload+tiled+chunked",
     1_200_000),
    ("ALST Llama-3-8B 8x H100-80GB", "llama-3-8b", 8, "80GiB", "2TB", "ulysses_attn", "offload+tiled+chunked",
     3_700_000),
    ("EasyContext Llama-2-7B 8x A100-80GB", "llama-2-7b", 8, "80GiB", "1TB", "zigzag_ring_attn", "offload", 700_000),
)  # fmt: skip


def anchors() -> list[dict]:
    """The published settings next to this model's prediction with each RMSNorm model: ``predicted`` /
    ``limited_by`` / ``config`` with transformers' eager norm (what the anchors table of the docstring shows),
    ``predicted_chunked`` / ... with ``enable_chunked_rmsnorm``."""
    out = []
    for label, model, gpus, gmem, hmem, mode, opt, published in ANCHORS:
        row = dict(label=label, mode=mode, option=opt, gpu_mem=gmem, host_mem=hmem, published=published)
        for norm in NORMS:
            setup = Setup(gpus=gpus, gpu_mem=parse_size(gmem), host_mem=parse_size(hmem), norm=norm)
            p = best_prediction(load_model_shape(model), setup, mode, OPTION_BY_NAME[opt])
            suffix = "" if norm == "eager" else f"_{norm}"
            row |= {f"predicted{suffix}": p.max_seq, f"limited_by{suffix}": p.limited_by, f"config{suffix}": p.config}
        out.append(row)
    return out


def format_anchors(rows: list[dict]) -> str:
    head = (f"  {'setting':<37}{'mode':<18}{'option':<23}{'published':>10}  {'eager norm (bound)':<29}"
            f"chunked norm (bound)")  # fmt: skip
    lines = ["Published anchors vs this model (not fitted):",
             head, "  " + "-" * (len(head) - 2)]  # fmt: skip
    for a in rows:
        eager = f"{a['predicted']:>10,} ({a['limited_by']})"
        chunked = f"{a['predicted_chunked']:>10,} ({a['limited_by_chunked']})"
        lines.append(f"  {a['label']:<37}{a['mode']:<18}{a['option']:<23}{a['published']:>10,}  {eager:<29}{chunked}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- validation
GIB = 2**30
PROBE_OPTIMIZERS = {"host_adamw": "host_adamw", "adamw": "ddp"}  # bench/max_context.py --optimizer -> --optim


def read_probes(path: str) -> list[dict]:
    """The successful ``max_context_probe`` rows of a ``bench/max_context.py --out`` JSONL file."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if row.get("name") == "max_context_probe" and row.get("status") == "ok":
                    rows.append(row)
    return rows


def _flag(command: str, name: str) -> int | None:
    m = re.search(rf"{name}[ =](\d+)", command or "")
    return int(m.group(1)) if m else None


def validate_probe(row: dict, **setup_kw) -> dict:
    """The planner at one measured probe of ``bench/max_context.py`` (one GPU, ``data_parallel``, micro-batch 1,
    ``offload-split+tiled+chunked`` with the probe's own number of offloaded layers ``offload_layers``, its MLP
    tile, chunk-1024 loss), next to what was measured. ``setup_kw`` overrides :class:`Setup` fields (frag,
    cuda_reserve, host_reserve, ...); ``norm`` defaults to the probe's own (``chunked`` when its command has
    ``--chunked-rmsnorm``, else ``eager``). Sizes in GiB; ``err_*`` = predicted / measured - 1.

    GPU: ``pred_gpu_allocated`` (the tensors of the peak phase) is compared with the measured peak allocated,
    ``pred_gpu_reserved`` (allocated x (1 + frag): what the caching allocator holds) with the measured peak
    reserved; ``pred_gpu_total`` adds the CUDA context reserve (outside the allocator, not in the measurement).
    Host: the steady-state host peak (``pred_host``; its phase ``host_phase``), and ``pred_host_lazy``: the peak
    of a first step whose optimizer state is allocated lazily at the step (after the backward), i.e. the larger of
    the forward/backward without the optimizer's host bytes and the optimizer step."""
    command = row.get("command", "")
    vocab = row.get("vocab_size") or _flag(command, "--vocab-size")
    shape = load_model_shape(row["model"].removeprefix("shape:"), vocab)
    kw = dict(gpus=1, gpu_mem=row.get("gpu_total_gib", 80) * GIB, host_mem=parse_size("1TB"),
              optim=PROBE_OPTIMIZERS[row.get("optimizer", "host_adamw")],
              mlp_tile_tokens=_flag(command, "--mlp-tile-tokens") or 8192,
              norm="chunked" if re.search(r"--chunked-rmsnorm\b", command) else "eager",
              checkpoint_every=int(row.get("checkpoint_every", 1)))  # fmt: skip
    setup = Setup(**(kw | {k: v for k, v in setup_kw.items() if v is not None}))
    option = parse_config("offload-split+tiled+chunked")
    k = int(row["offload_layers"])
    r = build_budget(shape, setup, "data_parallel", option, offload_layers=k).at(int(row["seq"]))
    # a first step whose optimizer state is allocated at the step: no master/moments/staging in the backward
    states = sum(b for n, b in r["host"] if n.startswith("HostAdamW fp32 master") or n.startswith("HostAdamW pinned"))
    lazy_bwd = r["host_phase_totals"]["forward/backward"] - states
    out = dict(
        model=shape.name,
        seq=int(row["seq"]),
        offload_layers=k,
        norm=setup.norm,
        params=shape.params,
        params_measured=row.get("params"),
        gpu_phase=r["peak_phase"],
        pred_gpu_allocated=r["gpu_allocated"] / GIB,
        pred_gpu_reserved=(1 + setup.frag) * r["gpu_allocated"] / GIB,
        pred_gpu_total=r["gpu_total"] / GIB,
        gpu_allocated=row["peak_gpu_gib"],
        gpu_reserved=row["peak_gpu_reserved_gib"],
        host_phase=r["host_peak_phase"],
        pred_host=r["host_total"] / GIB,
        pred_host_lazy=max(lazy_bwd, r["host_phase_totals"]["optimizer step"]) / GIB,
        host=row["peak_host_rss_gib"],
    )
    out["err_gpu_allocated"] = out["pred_gpu_allocated"] / out["gpu_allocated"] - 1
    out["err_gpu_reserved"] = out["pred_gpu_reserved"] / out["gpu_reserved"] - 1
    out["err_host"] = out["pred_host"] / out["host"] - 1
    out["err_host_lazy"] = out["pred_host_lazy"] / out["host"] - 1
    return out


def format_validation(checks: list[dict]) -> str:
    head = (
        f"{'model':<11}{'S':>9}{'k':>4} {'norm':<8}| {'GPU allocated':>13}{'pred':>7}{'err':>7} | {'reserved':>8}"
        f"{'pred':>7}{'err':>7} | {'GPU peak phase':<19}| {'host RSS':>8}{'steady':>8}{'err':>7}{'lazy':>8}{'err':>7}"
    )
    lines = [head, "-" * len(head)]
    for c in checks:
        lines.append(
            f"{c['model']:<11}{c['seq']:>9,}{c['offload_layers']:>4} {c['norm']:<8}| {c['gpu_allocated']:>13.2f}"
            f"{c['pred_gpu_allocated']:>7.2f}{c['err_gpu_allocated']:>+7.1%} | {c['gpu_reserved']:>8.2f}"
            f"{c['pred_gpu_reserved']:>7.2f}{c['err_gpu_reserved']:>+7.1%} | {c['gpu_phase']:<19}| {c['host']:>8.2f}"
            f"{c['pred_host']:>8.2f}{c['err_host']:>+7.1%}{c['pred_host_lazy']:>8.2f}{c['err_host_lazy']:>+7.1%}"
        )
    lines += [
        "GiB (measured, then predicted); k = layer inputs offloaded (the probe's own); norm = RMSNorm model (the",
        "probe's own unless --norm); reserved: predicted = allocated x (1 + frag); host: peak RSS vs the steady state",
        "(optimizer state allocated before the step) and vs a run whose optimizer state is allocated lazily at its",
        "first step (after the backward)",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- CLI
def _gb(x: float) -> str:
    return f"{x / GB:,.2f}"


def _tok(n: int) -> str:
    return f"{n:,}" if n else "-"


def format_breakdown(shape: ModelShape, setup: Setup, budget: Budget, seq: int) -> str:
    r = budget.at(seq)
    lay = budget.layout
    split = ""
    if budget.option.checkpointing == "offload-split":
        split = f"; {budget.offload_layers} of {budget.layers} stored layer inputs offloaded"
    lines = [
        f"Byte budget per GPU at S = {seq:,} tokens ({lay.seq_algo}, {budget.option.name}, {setup.optim}, "
        f"{setup.norm} RMSNorm; "
        f"{r['local_tokens']:,.0f} tokens per rank{split})",
        f"  GPU, peak phase = {r['peak_phase']!r} (GB):",
    ]
    width = max(len(n) for n, _ in r["gpu"] + r["host"]) + 2
    lines += [f"    {n:<{width}}{_gb(b):>10}" for n, b in r["gpu"]]
    lines.append(f"    {'TOTAL (peak)':<{width}}{_gb(r['gpu_total']):>10}   of {_gb(setup.gpu_mem)}")
    others = ", ".join(f"{p} {_gb(t)}" for p, t in r["phase_totals"].items())
    lines.append(f"    phase totals: {others}")
    lines.append(f"  host per node ({setup.procs_per_node} processes), peak phase = {r['host_peak_phase']!r} (GB):")
    lines += [f"    {n:<{width}}{_gb(b):>10}" for n, b in r["host"]]
    lines.append(f"    {'TOTAL':<{width}}{_gb(r['host_total']):>10}   of {_gb(setup.host_mem)}")
    others = ", ".join(f"{p} {_gb(t)}" for p, t in r["host_phase_totals"].items())
    lines.append(f"    phase totals: {others}")
    return "\n".join(lines)


def train_flags(shape: ModelShape, setup: Setup, mode: str, config: str, seq: int, budget: Budget) -> str:
    """The train.py flags that select ``mode`` and the memory configuration ``config`` (a :func:`parse_config`
    name) at ``seq`` tokens: what a planner row means on the command line."""
    option, r = parse_config(config), budget.at(seq)
    flags = [f"--parallel_mode {mode}", f"--seq-length {seq}"]
    if setup.sp_size != setup.gpus:
        flags.append(f"--sp-size {setup.sp_size}")
    flags += [f"--{name.replace('_', '-')} {value}" for name, value in budget.layout.options.items()]
    flags.append("--checkpointing " + ("full" if option.checkpointing == "full" else "offload"))
    if option.checkpointing == "offload-split":
        flags.append(f"--offload-layers {r['offload_layers']}")
    if setup.checkpoint_every > 1:
        flags.append(f"--checkpoint-every {setup.checkpoint_every}")
    if option.tiled_mlp:
        tile = setup.mlp_tile_tokens or shape.hidden
        flags.append(f"--tiled-mlp {setup.mlp_tiles or max(1, math.ceil(r['local_tokens'] / tile))}")
    flags.append("--loss " + ("chunked" if option.chunked_loss else "plain"))
    if setup.norm == "chunked":
        flags.append("--chunked-rmsnorm")
    if setup.optim == "host_adamw":
        flags.append("--optimizer host_adamw")
    return " ".join(flags)


def format_summary(preds: list[Prediction], setup: Setup) -> str:
    modes = list(dict.fromkeys(p.mode for p in preds))
    opts = list(dict.fromkeys(p.option for p in preds))
    by = {(p.mode, p.option): p for p in preds}
    w0 = max(len(m) for m in modes) + 8
    cols = [max(len(o), 16) for o in opts]
    head = f"{'max S (tokens)':<{w0}}" + "".join(f"{o:>{c + 2}}" for o, c in zip(opts, cols))
    lines = [head, "-" * len(head)]
    notes = []
    for m in modes:
        label = m
        rd = by[(m, opts[0])].ring_degree
        if rd is not None and by[(m, opts[0])].limited_by != "infeasible":
            label = f"{m} (R={rd})"
        cells = []
        for o, c in zip(opts, cols):
            p = by[(m, o)]
            if p.limited_by == "infeasible":
                cells.append(f"{'infeasible':>{c + 2}}")
                if p.reason not in notes:
                    notes.append(p.reason)
            else:
                tag = ("h" if p.limited_by == "host" else "g") + ("*" if p.config != p.option else " ")
                cells.append(f"{_tok(p.max_seq) + ' ' + tag:>{c + 2}}")
        lines.append(f"{label:<{w0}}" + "".join(cells))
    for o in opts:
        split = [f"{m} {by[(m, o)].offload_layers}" for m in modes if by[(m, o)].offload_layers is not None]
        if split and o.startswith("offload-split"):
            lines.append(f"{o}: layer inputs offloaded at max S (the host full, the rest on GPU): {', '.join(split)}")
    lines.append("g = bounded by GPU memory, h = by host memory; S rounded down to lcm(seq_multiple, 1024)")
    lines.append("* = reached with a subset of the option's features (the others cost more than they save here)")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def build_parser() -> cli.ArgumentParser:
    """The parser of ``python -m easy_context.plan`` (:func:`main`)."""
    ap = cli.ArgumentParser(
        prog="python -m easy_context.plan",
        description="Predict the byte budget and longest trainable context per SP mode and memory option.",
        epilog="Assumptions: see `python -c 'import easy_context.plan as p; help(p)'`.",
    )
    ap.add_argument("--model", help="config.json path, built-in name (llama-3-8b, ...) or preset")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs in all (nodes x GPUs per node)")
    ap.add_argument("--gpu-mem", default="80GB", help="per GPU: 80GB (1e9), 80GiB (2^30), 141GB")
    ap.add_argument("--host-mem", default="1TB", help="per node")
    ap.add_argument("--gpus-per-node", type=int, default=None, help="default min(gpus, 8)")
    modes = registry.SEQ_ALGOS
    ap.add_argument("--sp", nargs="+", default=list(modes), choices=modes, metavar="MODE", help=f"{modes}")
    ap.add_argument("--sp-size", type=int, default=None, help="SP group size W (default all GPUs)")
    registry.add_option_args(ap)  # each backend's options (usp_attn's --ring-degree); default: searched
    ap.add_argument("--optim", default="zero3_offload", choices=OPTIMS, help="optimizer state placement")
    ap.add_argument(
        "--options",
        nargs="+",
        default=[o.name for o in OPTIONS],
        choices=[o.name for o in OPTIONS],
        help="memory options to compare",
    )
    ap.add_argument("--mlp-tiles", default="auto", help="tiled MLP tile count, or 'auto' (tiles of h tokens)")
    ap.add_argument("--mlp-tile-tokens", type=int, default=None, help="tiled MLP tiles of this many tokens (8192)")
    ap.add_argument("--loss-chunk", type=int, default=LOSS_CHUNK, help="tokens per chunk of the chunked LM-head loss")
    ap.add_argument(
        "--norm",
        choices=NORMS,
        default=None,
        help="RMSNorm autograd: eager (transformers', the default) or chunked (enable_chunked_rmsnorm); "
        "--validate: default the probe's own",
    )
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=1,
        metavar="K",
        help="keep every K-th layer input, regenerate the others (as train.py --checkpoint-every)",
    )
    ap.add_argument("--vocab-size", type=int, default=None, help="override the vocab (presets default to 32000)")
    ap.add_argument("--frag", type=float, default=0.10, help="allocator fragmentation overhead (0.10 = 10%%)")
    ap.add_argument("--cuda-reserve", default="1.5GB", help="CUDA context and runtime per GPU")
    ap.add_argument("--host-reserve", default="3GB", help="host runtime per process")
    ap.add_argument("--no-pinned-pow2", action="store_true", help="pinned blocks not rounded to powers of two")
    ap.add_argument("--seq", type=int, default=None, help="S for the breakdown (default: max of the best option)")
    ap.add_argument(
        "--offload-layers",
        type=int,
        default=None,
        help="offload-split breakdown: layer inputs on the host (default: as many as the host holds)",
    )
    ap.add_argument(
        "--show", default=None, metavar="MODE:CONFIG", help="breakdown for e.g. zigzag_ring_attn:offload+tiled"
    )
    ap.add_argument("--anchors", action="store_true", help="also print the published anchors vs predictions")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument(
        "--validate",
        metavar="JSONL",
        default=None,
        help="compare with the measured probes of a bench/max_context.py --out file (and exit)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.validate:
        overrides = dict(
            frag=args.frag,
            cuda_reserve=parse_size(args.cuda_reserve),
            host_reserve=parse_size(args.host_reserve),
            pinned_pow2=not args.no_pinned_pow2,
            norm=args.norm,
        )
        checks = [validate_probe(r, **overrides) for r in read_probes(args.validate)]
        if args.json:
            json.dump(checks, sys.stdout, indent=2)
            print()
        else:
            print(format_validation(checks))
        return 0
    if not args.model:
        ap.error("--model is required")

    try:
        shape = load_model_shape(args.model, args.vocab_size)
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    if args.mlp_tiles != "auto" and args.mlp_tile_tokens:
        ap.error("give --mlp-tiles or --mlp-tile-tokens, not both")
    setup = Setup(
        gpus=args.gpus,
        gpu_mem=parse_size(args.gpu_mem),
        host_mem=parse_size(args.host_mem),
        gpus_per_node=args.gpus_per_node,
        sp_size=args.sp_size,
        optim=args.optim,
        mlp_tiles=None if args.mlp_tiles == "auto" else int(args.mlp_tiles),
        mlp_tile_tokens=args.mlp_tile_tokens,
        loss_chunk=args.loss_chunk,
        frag=args.frag,
        cuda_reserve=parse_size(args.cuda_reserve),
        host_reserve=parse_size(args.host_reserve),
        pinned_pow2=not args.no_pinned_pow2,
        norm=args.norm or "eager",
        checkpoint_every=args.checkpoint_every,
        **{k: v for k, v in registry.option_values(args).items() if k in Setup.__dataclass_fields__},
    )
    options = [OPTION_BY_NAME[o] for o in args.options]
    preds = plan(shape, setup, args.sp, options)
    if args.show:  # a mode and a concrete configuration (e.g. zigzag_ring_attn:offload+tiled)
        mode, _, cfg = args.show.partition(":")
        if mode not in registry.SEQ_ALGOS:
            ap.error(f"--show: unknown mode {mode!r}")
        chosen = predict(shape, setup, mode, parse_config(cfg or "offload+tiled+chunked"))
    else:  # the longest prediction (the first registered mode on ties)
        chosen = max(preds, key=lambda p: (p.max_seq, -registry.SEQ_ALGOS.index(p.mode)))
    seq = args.seq if args.seq is not None else chosen.max_seq
    if seq <= 0:
        seq = math.lcm(mode_layout(chosen.mode, shape, setup).multiple, ROUND_TOKENS)
    budget = budget_at(shape, setup, chosen.mode, parse_config(chosen.config), seq, args.offload_layers)
    flags = train_flags(shape, setup, chosen.mode, chosen.config, seq, budget)

    if args.json:
        r = budget.at(seq)
        out = dict(
            model=dict(asdict(shape), params=shape.params, layer_params=shape.layer_params),
            setup=asdict(setup),
            predictions=[asdict(p) for p in preds],
            breakdown=dict(mode=chosen.mode, config=chosen.config, seq=seq, local_tokens=r["local_tokens"],
                           offload_layers=r["offload_layers"], peak_phase=r["peak_phase"],
                           phase_totals=r["phase_totals"], gpu={n: b for n, b in r["gpu"]},
                           gpu_allocated=r["gpu_allocated"], gpu_total=r["gpu_total"],
                           host={n: b for n, b in r["host"]}, host_peak_phase=r["host_peak_phase"],
                           host_phase_totals=r["host_phase_totals"], host_total=r["host_total"],
                           train_flags=flags),
        )  # fmt: skip
        if args.anchors:
            out["anchors"] = anchors()
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0

    print(
        f"{shape.name}: {shape.params / 1e9:.2f}B params (h={shape.hidden}, L={shape.layers}, heads={shape.heads}/"
        f"{shape.kv_heads} kv, head_dim={shape.head_dim}, i={shape.intermediate}, V={shape.vocab}); {setup.gpus} GPU "
        f"x {_gb(setup.gpu_mem)} GB, host {_gb(setup.host_mem)} GB/node ({setup.procs_per_node} GPUs/node), "
        f"SP size {setup.sp_size}, {setup.optim}, {setup.norm} RMSNorm"
    )
    print()
    print(format_breakdown(shape, setup, budget, seq))
    launch = OPTIM_CONFIGS[setup.optim].format(gpus=setup.gpus)
    print(f"  as a run ({setup.optim}; {launch}): train.py {flags}")
    print()
    print(format_summary(preds, setup))
    if args.anchors:
        print()
        print(format_anchors(anchors()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
