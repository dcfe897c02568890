"""A few fixed prompts answered greedily: does an extended model still answer short questions as the base did?

    python -m easy_context.eval.fixed_prompts --model out/extended --output out/eval/extended/prompts.json

Writes ``[{"prompt", "chat", "output", "expect", "found"}]``: ``found`` is whether the expected word appears in the
output (None for prompts without one). Chat prompts use the tokenizer's chat template (plain text without one).
Every prompt starts as the model was pre-trained: with the tokenizer's BOS when it adds one (Gemma answers "The The
The" without it), once (:func:`easy_context.models.tokenizer.encode`).
"""

from __future__ import annotations

import json
import os
import sys

import torch

from easy_context import cli
from easy_context.models.resolve import MODEL_HELP
from easy_context.models.tokenizer import encode

# (prompt, through the chat template, a word the answer should contain)
PROMPTS: tuple[tuple[str, bool, str | None], ...] = (
    ("The capital of France is", False, "Paris"),
    ('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', False, None),
    ("Water freezes at a temperature of", False, "0"),
    ("What is the largest planet in our solar system?", True, "Jupiter"),
    ("Who wrote the play Romeo and Juliet?", True, "Shakespeare"),
    ("Translate to French: good morning", True, "Bonjour"),
)


def prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    """The model input of ``prompt`` (through the chat template when ``chat`` and the tokenizer has one)."""
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
    else:
        text = prompt
    return encode(tokenizer, text)


def answer(model, tokenizer, prompt: str, chat: bool, max_new_tokens: int) -> str:
    """The greedy continuation of ``prompt`` (:func:`prompt_ids`)."""
    ids = torch.tensor([prompt_ids(tokenizer, prompt, chat)], device=model.device)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def run(model_name: str, tokenizer_name: str | None, max_new_tokens: int, device: str) -> list[dict]:
    """Every prompt of :data:`PROMPTS` through ``model_name``."""
    from easy_context.models import load_model
    from easy_context.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_name or model_name)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = load_model(model_name, vocab_size=len(tokenizer), dtype=dtype).to(device).eval()
    rows = []
    for prompt, chat, expect in PROMPTS:
        output = answer(model, tokenizer, prompt, chat, max_new_tokens)
        found = None if expect is None else expect.lower() in output.lower()
        rows.append({"prompt": prompt, "chat": chat, "output": output, "expect": expect, "found": found})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(prog="python -m easy_context.eval.fixed_prompts", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--tokenizer", default=None, help="defaults to --model")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--output", required=True, help="the JSON file to write")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        rows = run(args.model, args.tokenizer, args.max_new_tokens, device)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    for row in rows:
        check = "" if row["found"] is None else f"  [{row['expect']}: {row['found']}]"
        print(f"{row['prompt'][:40]!r} -> {row['output'][:60]!r}{check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
