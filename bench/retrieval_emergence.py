"""When does a small model trained from scratch start to retrieve needles? (the demo's base model, measured)

Trains a random-init Llama on rows of the essays mixed with needle-retrieval rows (easy_context.data.needles, the
eval's format) at a short length, and scores teacher-forced needle retrieval (eval_needle's prompts) every
--eval-every steps. A plain single-process loop: it measures how many steps/tokens the skill needs, on any device.

    python bench/retrieval_emergence.py --device cuda --steps 10000 --batch 32 --time-limit 400 \\
        --digit-groups 3 --tie --needle-fraction 1.0 --output out/emergence.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from easy_context.data import load_documents, train_byte_level_bpe
from easy_context.data.needles import NeedleMix, retrieval_row
from easy_context.tasks.haystack import Haystack, read_haystack_text
from easy_context.tasks.needle import make_case


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--haystack", default="PaulGrahamEssays")
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--digit-groups", type=int, default=3)
    p.add_argument("--seq-length", type=int, default=256)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--tie", action="store_true", help="tie input and output embeddings")
    p.add_argument("--needle-fraction", type=float, default=1.0)
    p.add_argument("--needles-per-doc", type=int, default=1)
    p.add_argument("--needle-loss", default="answer", choices=["answer", "all"], help="what retrieval rows train on")
    p.add_argument("--digits", type=int, default=7)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--time-limit", type=float, default=math.inf, help="seconds")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-lengths", default="64,128,192", help="haystack lengths scored (within the row length)")
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="JSONL of the evaluations")
    return p.parse_args(argv)


@torch.no_grad()
def retrieval(model, tokenizer, haystack: Haystack, lengths: list[int], samples: int, digits: int) -> dict:
    """Teacher-forced exact match of the needle's number per haystack length (eval_needle's prompts)."""
    model.eval()
    scores = {}
    for length in lengths:
        hits = 0
        for sample in range(samples):
            case = make_case(haystack, length, 100.0 * (sample % 5) / 4, sample, digits, 0, seed=123)
            full = tokenizer(case.prompt + case.answer, add_special_tokens=False)["input_ids"]
            start = len(tokenizer(case.prompt, add_special_tokens=False)["input_ids"])
            logits = model(torch.tensor([full[:-1]], device=model.device), use_cache=False).logits[0, start - 1 :]
            hits += int(torch.equal(logits.argmax(-1).cpu(), torch.tensor(full[start:])))
        scores[length] = hits / samples
    model.train()
    return scores


def main(argv=None) -> None:
    args = parse_args(argv)
    from transformers import AutoConfig, AutoModelForCausalLM

    out_dir = os.path.join("out", "retrieval_emergence_tokenizer")
    tokenizer = train_byte_level_bpe(load_documents(args.haystack), args.vocab, out_dir, digit_group=args.digit_groups)
    text = read_haystack_text(args.haystack)
    haystack = Haystack.from_text(text, tokenizer)
    stream = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    mix = NeedleMix(args.needle_fraction, args.digits, args.needles_per_doc, args.needle_loss)
    config = AutoConfig.for_model(
        "llama", vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75),
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 2),
        tie_word_embeddings=args.tie, max_position_embeddings=args.seq_length,
    )  # fmt: skip
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(args.seed)
    row = args.seq_length + 1

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, labels): labels are the rows with -100 where a retrieval row does not train."""
        rows, trained = [], []
        for _ in range(args.batch):
            if rng.random() < mix.fraction:
                ids, mask = retrieval_row(rng, haystack, tokenizer, row, stream, mix)
            else:
                begin = rng.randrange(len(stream) - row)
                ids, mask = stream[begin : begin + row], np.ones(row, dtype=bool)
            rows.append(ids)
            trained.append(mask)
        ids = torch.from_numpy(np.stack(rows))
        labels = ids.masked_fill(~torch.from_numpy(np.stack(trained)), -100)
        return ids.to(args.device), labels.to(args.device)

    lengths = [int(n) for n in args.eval_lengths.split(",")]
    log = open(args.output, "w") if args.output else None
    start = time.time()
    for step in range(1, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, step / 20)
        rows, labels = batch()
        loss = model(rows, labels=labels, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % args.eval_every == 0 or step == args.steps or time.time() - start > args.time_limit:
            scores = retrieval(model, tokenizer, haystack, lengths, args.samples, args.digits)
            record = {"step": step, "tokens": step * args.batch * args.seq_length, "loss": round(loss.item(), 4),
                      "seconds": round(time.time() - start, 1), "retrieval": scores}  # fmt: skip
            print(json.dumps(record), flush=True)
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
            if time.time() - start > args.time_limit:
                break


if __name__ == "__main__":
    main()
