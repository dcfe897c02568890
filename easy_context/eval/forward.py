"""No-grad forwards of one sequence under any backend, returning only what the eval needs.

The sequence is padded to the backend's multiple (``SPConfig.local_batch``: pad tokens come last and
real tokens never attend to them), sharded, and run through the decoder with global ``position_ids``. Then:

* :func:`logits_at` — logits of a few global positions. Each rank projects only the hidden states of the
  requested positions it holds; one all-reduce (sum over disjoint rows, so exact) hands every rank the
  ``(n, vocab)`` rows. The full ``(seq, vocab)`` logits never exist.
* :func:`loss_sum` — this rank's summed cross-entropy and valid-target count through
  :class:`~easy_context.loss.CausalLMWithLoss` (chunked: no logits either).
* :func:`greedy_generate` — greedy decoding: an SP prefill, then one token per forward against a KV cache that stays
  sharded over the ranks (:mod:`easy_context.hf.kv_cache`).

Every rank of the SP group calls these with the same full sequence (lockstep).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.distributed as dist

from easy_context.core.groups import get_sp_group
from easy_context.eval.runtime import EvalRuntime
from easy_context.hf.kv_cache import ShardedKVCache
from easy_context.hf.support import decoder_of
from easy_context.loss.logit_scale import logit_multiplier


def _shard(
    runtime: EvalRuntime, ids: torch.Tensor, targets: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(local input ids, local position ids, local targets) of (1, seq) ``ids``/``targets`` on this rank."""
    local = runtime.sp.local_batch(ids, None, targets, runtime.device, pad_token_id=pad_id)
    return local.input_ids, local.position_ids, local.target_ids


def _head_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """LM-head logits (fp32) of ``hidden`` (n, H), with the model's final soft-capping if it has one."""
    logits = model.get_output_embeddings()(hidden).float()  # a module call: ZeRO-3 gathers the weight here
    scale = logit_multiplier(model.config)  # Cohere multiplies, Granite divides, ... (loss/logit_scale.py)
    if scale != 1.0:
        logits = logits * scale
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


@torch.no_grad()
def logits_at(model, runtime: EvalRuntime, ids: list[int], positions: list[int], pad_id: int) -> torch.Tensor:
    """fp32 ``(len(positions), vocab)`` logits at ``positions`` of the sequence ``ids`` (same on every rank)."""
    full = torch.tensor([ids], dtype=torch.long)
    local_ids, local_pos, _ = _shard(runtime, full, full, pad_id)
    hidden = decoder_of(model)(input_ids=local_ids, position_ids=local_pos, use_cache=False).last_hidden_state
    want = torch.tensor(positions, dtype=torch.long, device=local_pos.device)
    rows, slots = (local_pos[0].unsqueeze(1) == want.unsqueeze(0)).nonzero(as_tuple=True)
    picked = _head_logits(model, hidden[0, rows])  # every rank calls the head, even with 0 rows (ZeRO-3)
    out = torch.zeros(len(positions), picked.shape[-1], dtype=torch.float32, device=picked.device)
    out[slots] = picked
    if runtime.distributed and runtime.world_size > 1:
        dist.all_reduce(out, group=get_sp_group())
    return out


@torch.no_grad()
def loss_sum(model_with_loss, runtime: EvalRuntime, ids: list[int], targets: list[int], pad_id: int):
    """This rank's (summed cross-entropy fp32, number of valid targets) over its shard; targets -100 are ignored.

    ``model_with_loss`` is a :class:`~easy_context.loss.CausalLMWithLoss`; ``targets[i]`` is the token after
    ``ids[i]``. Reduce over ranks with :func:`easy_context.loss.global_mean_for_logging`.
    """
    full_ids = torch.tensor([ids], dtype=torch.long)
    full_targets = torch.tensor([targets], dtype=torch.long)
    local_ids, local_pos, local_targets = _shard(runtime, full_ids, full_targets, pad_id)
    total, count = model_with_loss(local_ids, local_pos, local_targets)
    return total.float(), count


def _attends_through_easy_context(model) -> bool:
    return str(getattr(model.config, "_attn_implementation", "")).startswith("easy_context_")


@torch.no_grad()
def greedy_generate(
    model,
    runtime: EvalRuntime,
    ids: list[int],
    max_new_tokens: int,
    pad_id: int,
    eos_id: int | None = None,
    stop: Callable[[list[int]], bool] | None = None,
) -> list[int]:
    """Greedy continuation of ``ids`` (at most ``max_new_tokens``; stops after EOS, or once ``stop(new_ids)`` is
    true); the same on every rank.

    One prefill of the prompt, then one forward per new token against a KV cache: under easy_context's attention
    (every SP mode; data parallel with a named kernel) the cache stays sharded where the prefill put it
    (:class:`~easy_context.hf.kv_cache.ShardedKVCache`); with the model's own attention (data parallel, kernel
    ``auto``) it is transformers' ``DynamicCache``, i.e. what ``model.generate`` computes.
    """
    decoder = decoder_of(model)
    new: list[int] = []
    if _attends_through_easy_context(model):
        cache = ShardedKVCache(runtime.distributed)
        with cache.prefill(len(ids)):
            logits = logits_at(model, runtime, ids, [len(ids) - 1], pad_id)[0]

        def step(token: int, position: int) -> torch.Tensor:
            with cache.decode():
                hidden = decoder(input_ids=torch.tensor([[token]], device=runtime.device),
                                 position_ids=torch.tensor([[position]], device=runtime.device),
                                 use_cache=False).last_hidden_state  # fmt: skip
            return _head_logits(model, hidden[0, -1:])[0]
    else:
        from transformers import DynamicCache

        # transformers >= 5.2x names the argument ``cache`` (``past_key_values`` deprecated); older ones only the latter
        cache_arg = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
        hf_cache = {cache_arg: DynamicCache(config=model.config)}
        prompt = torch.tensor([ids], device=runtime.device)
        hidden = decoder(input_ids=prompt, position_ids=torch.arange(len(ids), device=runtime.device)[None],
                         use_cache=True, **hf_cache).last_hidden_state  # fmt: skip
        logits = _head_logits(model, hidden[0, -1:])[0]

        def step(token: int, position: int) -> torch.Tensor:
            hidden = decoder(input_ids=torch.tensor([[token]], device=runtime.device),
                             position_ids=torch.tensor([[position]], device=runtime.device),
                             use_cache=True, **hf_cache).last_hidden_state  # fmt: skip
            return _head_logits(model, hidden[0, -1:])[0]

    for i in range(max_new_tokens):
        token = int(logits.argmax())
        new.append(token)
        if (eos_id is not None and token == eos_id) or (stop is not None and stop(new)) or i + 1 == max_new_tokens:
            break
        logits = step(token, len(ids) + i)
    return new


def can_batch_generate(model, runtime: EvalRuntime) -> bool:
    """Whether :func:`greedy_generate_batch` decodes several prompts at once: data parallel with the model's own
    attention (transformers' cache), every layer full attention; else it decodes them one at a time (the sharded SP
    cache holds one sequence; sliding-window and recurrent layers keep no left-padded history)."""
    from transformers.cache_utils import DynamicLayer

    if runtime.distributed or _attends_through_easy_context(model):
        return False
    from transformers import DynamicCache

    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def _prefill(model, runtime: EvalRuntime, ids: list[int]):
    """(last-position logits, a transformers ``DynamicCache`` of ``ids``): one unpadded, unmasked prefill."""
    from transformers import DynamicCache

    decoder = decoder_of(model)
    cache_arg = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    cache = DynamicCache(config=model.config)
    prompt = torch.tensor([ids], device=runtime.device)
    hidden = decoder(input_ids=prompt, position_ids=torch.arange(len(ids), device=runtime.device)[None],
                     use_cache=True, **{cache_arg: cache}).last_hidden_state  # fmt: skip
    return _head_logits(model, hidden[0, -1:])[0], cache


@torch.no_grad()
def greedy_generate_batch(
    model,
    runtime: EvalRuntime,
    prompts: list[list[int]],
    budgets: list[int],
    pad_id: int,
    eos_id: int | None = None,
    stops: list[Callable[[list[int]], bool] | None] | None = None,
) -> list[list[int]]:
    """:func:`greedy_generate` of several prompts (``budgets[i]``, ``stops[i]`` each), the decoding batched.

    Each prompt is prefilled on its own (no padding, so no mask and no length^2 buffer at long lengths); the caches
    are then left-padded into one batch and every step is one forward for the prompts still going (a finished one
    leaves the batch with its cache rows), the pads masked out and each prompt at its own positions: the same greedy
    continuations as one at a time, up to floating-point reassociation. Where :func:`can_batch_generate` is false,
    one at a time."""
    stops = stops or [None] * len(prompts)
    if not can_batch_generate(model, runtime) or len(prompts) == 1:
        return [greedy_generate(model, runtime, ids, budget, pad_id, eos_id, stop)
                for ids, budget, stop in zip(prompts, budgets, stops)]  # fmt: skip
    from transformers import DynamicCache

    decoder = decoder_of(model)
    cache_arg = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    device = runtime.device
    width = max(len(ids) for ids in prompts)
    first, cache = [], DynamicCache(config=model.config)
    parts: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in cache.layers]
    for ids in prompts:
        logits, own = _prefill(model, runtime, ids)
        first.append(logits)
        for mine, theirs in zip(parts, own.layers):  # left padding to the longest prompt
            pad = (0, 0, width - len(ids), 0)
            mine.append((torch.nn.functional.pad(theirs.keys, pad), torch.nn.functional.pad(theirs.values, pad)))
        del own
    for layer, pieces in enumerate(parts):
        cache.layers[layer].update(torch.cat([k for k, _ in pieces]), torch.cat([v for _, v in pieces]))
    del parts
    logits = torch.stack(first)
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for row, ids in enumerate(prompts):
        mask[row, width - len(ids) :] = 1
    last = torch.tensor([len(ids) - 1 for ids in prompts], device=device)
    new: list[list[int]] = [[] for _ in prompts]
    going = list(range(len(prompts)))  # the prompt of each batch row
    for step in range(max(budgets)):
        tokens = logits.argmax(-1).tolist()
        keep = []
        for row, (index, token) in enumerate(zip(going, tokens)):
            new[index].append(token)
            stop = stops[index]
            done = (eos_id is not None and token == eos_id) or step + 1 >= budgets[index]
            if not (done or (stop is not None and stop(new[index]))):
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(going):  # the finished prompts leave the batch
            rows = torch.tensor(keep, device=device)
            cache.batch_select_indices(rows)
            mask, last = mask[rows], last[rows]
            tokens = [tokens[row] for row in keep]
            going = [going[row] for row in keep]
        mask = torch.cat([mask, mask.new_ones((len(going), 1))], dim=-1)
        last = last + 1
        step_ids = torch.tensor(tokens, device=device)[:, None]
        hidden = decoder(input_ids=step_ids, attention_mask=mask, position_ids=last[:, None], use_cache=True,
                         **{cache_arg: cache}).last_hidden_state  # fmt: skip
        logits = _head_logits(model, hidden[:, -1])
    return new
