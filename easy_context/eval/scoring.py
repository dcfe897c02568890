"""Scoring a needle prompt: teacher-forced exact match of the answer tokens, optionally greedy generation.

Prompt and answer are tokenized *together* (``prompt + answer``) and the answer tokens are the ones after the
longest prefix shared with the prompt's own encoding. So a tokenizer that merges the space before the number
into the number (Llama-3's " 123") or re-tokenizes the boundary scores exactly the tokens it would produce.
"""

from __future__ import annotations

import re

import torch

from easy_context.eval.forward import greedy_generate, logits_at
from easy_context.eval.runtime import EvalRuntime
from easy_context.eval.tokens import common_prefix_length
from easy_context.models.tokenizer import encode
from easy_context.tasks.needle import NeedleCase


def answer_split(tokenizer, prompt: str, answer: str) -> tuple[list[int], int]:
    """(ids of ``prompt + answer``, index of the first answer token) — the answer tokens are ``ids[start:]``; the
    model input starts as :func:`encode` starts it (the tokenizer's BOS when it adds one)."""
    full = encode(tokenizer, prompt + answer)
    start = common_prefix_length(encode(tokenizer, prompt), full)
    start = min(max(start, 1), len(full) - 1)  # at least one token of context, at least one answer token
    return full, start


def score_case(
    model,
    runtime: EvalRuntime,
    tokenizer,
    case: NeedleCase,
    pad_id: int,
    generate: bool = False,
) -> dict:
    """One results row: teacher-forced exact match (``correct``), the argmax text and, with ``generate``, greedy."""
    ids, start = answer_split(tokenizer, case.prompt, case.answer)
    targets = torch.tensor(ids[start:])
    logits = logits_at(model, runtime, ids[:-1], list(range(start - 1, len(ids) - 1)), pad_id).cpu()
    predicted = logits.argmax(dim=-1)
    logprob = torch.log_softmax(logits, dim=-1).gather(1, targets.unsqueeze(1)).sum()
    row = {
        "length": case.length,
        "depth": case.depth,
        "sample": case.sample,
        "correct": int(bool((predicted == targets).all())),
        "predicted": tokenizer.decode(predicted.tolist()),
        "answer": case.answer,
        "city": case.city,
        "answer_logprob": round(float(logprob), 6),
        "prompt_tokens": start,
        "answer_tokens": len(ids) - start,
    }
    if generate:
        prompt_ids = encode(tokenizer, case.prompt)
        new = greedy_generate(model, runtime, prompt_ids, len(ids) - start + 2, pad_id, tokenizer.eos_token_id)
        text = tokenizer.decode(new, skip_special_tokens=True)
        row["generated"] = text
        row["generated_correct"] = int(re.match(rf"\s*{re.escape(case.number)}(?!\d)", text) is not None)
    return row
