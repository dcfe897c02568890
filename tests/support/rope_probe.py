"""What decides a loaded model's positions, read with whichever transformers is importable: the rotary inverse
frequencies and attention scaling per layer type, and the fp32 logits of given ids.

Imported under transformers 5 (tests/e2e/test_config_compat.py) and run as a script under transformers 4.x (its own
install dir first on PYTHONPATH), so both versions are read by the same code:

    python tests/support/rope_probe.py REQUEST.json OUT.pt

REQUEST.json: ``[{"name": ..., "folder": ..., "ids": [[...]] or null, "overrides": {...}}, ...]``; ``ids`` null:
only the config is read from the folder, with ``overrides``, and a model of that shape built (no weights loaded).
Nothing here imports easy_context (which needs transformers 5).
"""

from __future__ import annotations

import json
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def rotary(model) -> dict[str, tuple[torch.Tensor, float]]:
    """Per layer type, (inv_freq, attention_scaling): transformers 5 keeps one module with a buffer per type
    (``full_attention_inv_freq``); 4.x one module per RoPE (Gemma 3: ``rotary_emb`` global, ``rotary_emb_local``)."""
    inner = model.model
    emb = inner.rotary_emb
    types = [t for t in ("full_attention", "sliding_attention") if hasattr(emb, f"{t}_inv_freq")]
    if types:
        return {
            t: (getattr(emb, f"{t}_inv_freq").clone(), float(getattr(emb, f"{t}_attention_scaling"))) for t in types
        }
    out = {"full_attention": (emb.inv_freq.clone(), float(emb.attention_scaling))}
    local = getattr(inner, "rotary_emb_local", None)
    if local is not None:
        out["sliding_attention"] = (local.inv_freq.clone(), float(local.attention_scaling))
    return out


def probe(folder: str, ids: list[list[int]] | None = None, overrides: dict | None = None) -> dict:
    """``{"rotary": rotary(model), "logits": (batch, seq, vocab) fp32 or None}`` of the model at ``folder``."""
    if ids is None:
        config = AutoConfig.from_pretrained(folder, **(overrides or {}))
        model = AutoModelForCausalLM.from_config(config)
        return {"rotary": rotary(model), "logits": None}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits.float()
    return {"rotary": rotary(model), "logits": logits}


def main(request: str, out: str) -> None:
    torch.manual_seed(0)
    results = {r["name"]: probe(r["folder"], r.get("ids"), r.get("overrides")) for r in json.load(open(request))}
    torch.save({"transformers": transformers.__version__, "results": results}, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
