"""Model zoo: every decoder-only causal-LM family of the installed transformers, tiny, under easy_context.

    PYTHONPATH=. python bench/model_zoo.py [--families llama,phi3,...] [--json results/cpu/model_zoo.json]

For each family a tiny random model (hidden 64, 2 layers, 4 query / 2 K/V heads of 16 where the family allows, vocab
128, fp32, eager attention; windows of 5 tokens where the family has sliding windows) is compared with the
single-process eager model on 2 rows of 24 tokens:

* ``zigzag_ring_attn`` on 2 gloo ranks: the logits of each rank's shard and every parameter gradient (summed over
  the ranks) of the token-mean loss;
* ``data_parallel`` through easy_context's attention (``always=True``) on one process: logits and gradients;
* ``easy_context.loss.CausalLMWithLoss`` (train.py's loss) against the model's own ``labels=`` loss and gradients.

A family passes when every relative error (max |x - ref| / max |ref|) is below 2e-5. It is *refused* when easy_context
raises its own error (the model needs something sequence parallelism does not implement), and *skipped* when it is
not a decoder-only language model or cannot be built tiny (the reason is printed). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import sys
import time
import traceback
import warnings
from typing import Any

import torch
from zoo_models import SEQ, VARIANTS, batch, families, tiny_model  # bench/zoo_models.py

TOLERANCE = 2e-5
NOISE_FACTOR = 3  # a family whose fp32 eager model is itself this far from fp64 gets NOISE_FACTOR x that as tolerance
GRAD_FLOOR = 1e-3  # gradients below this fraction of the model's largest are compared against it (_grad_errors)

# Families that are not decoder-only language models (or are swept through their text model), with the reason.
NOT_DECODERS = {
    **dict.fromkeys(["bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus",
                     "plbart", "prophetnet", "trocr", "whisper"],
                    "the decoder of an encoder-decoder (cross-attention)"),
    **dict.fromkeys(["bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie",
                     "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer",
                     "xlm-roberta", "xlm-roberta-xl", "xmod"], "a bidirectional encoder with an LM head (is_decoder)"),
    "xlm": "a masked/translation LM (not causal decoder-only)",
    "xlnet": "permutation LM with two-stream attention (not causal decoder-only)",
    "reformer": "LSH / local-chunk attention with reversible layers (not a softmax decoder over the sequence)",
    "cpmant": "prefix-bidirectional segment attention (not causal decoder-only)",
    **dict.fromkeys(["gemma3", "gemma3n", "gemma4", "gemma4_unified", "gemma4_unified_assistant", "llama4", "qwen3_5",
                     "qwen3_5_moe", "qwen4_exp", "dots3_note"], "multimodal wrapper (its text model is swept)"),
    **dict.fromkeys(["fuyu", "git", "got_ocr2", "mllama", "emu3", "phi4_multimodal", "moshi", "musicgen",
                     "musicgen_melody", "moss_transcribe_diarize"], "multimodal (vision / audio inputs)"),
    "blt": "byte-latent transformer: local encoder/decoder with cross-attention over byte patches",
}  # fmt: skip


def rel_err(x: torch.Tensor, ref: torch.Tensor, floor: float = 1e-30) -> float:
    """max |x - ref| / max(max |ref|, floor) in float64."""
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(floor)).item()


def _loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")


def _grad_errors(model, ref_model, reduce: bool) -> dict[str, float]:
    """Each parameter's gradient error relative to its reference gradient, or to GRAD_FLOOR of the model's largest
    gradient where its own is smaller: a gradient that is zero in exact arithmetic (a key bias without RoPE: softmax
    ignores a shift shared by all keys) is rounding noise (1e-11 .. 1e-9) on both sides."""
    import torch.distributed as dist

    named = zip(model.named_parameters(), ref_model.named_parameters())
    pairs = [(n, p, r) for (n, p), (_, r) in named if r.grad is not None]  # None: unused on one process (MTP head)
    floor = GRAD_FLOOR * max((r.grad.abs().max().item() for _, _, r in pairs), default=0.0)
    errs = {}
    for name, p, p_ref in pairs:
        grad = torch.zeros_like(p) if p.grad is None else p.grad.clone()
        if reduce:
            dist.all_reduce(grad)  # the global loss' gradient is the sum over SP ranks
        errs[name] = rel_err(grad, p_ref.grad, floor)
    return errs


def _summary(errs: dict[str, float]) -> dict[str, Any]:
    grads = {k: v for k, v in errs.items() if k != "logits"}
    worst = max(grads, key=grads.get) if grads else None
    return {"logits": errs["logits"], "grad": grads[worst] if worst else 0.0, "worst_grad": worst}


def reference(family: str, dtype: torch.dtype = torch.float32):
    """(model after backward, inputs, positions, targets, logits) of the single-process eager model."""
    model = tiny_model(family).to(dtype)
    inputs, targets = batch()
    positions = torch.arange(SEQ).expand_as(inputs)
    logits = model(inputs, position_ids=positions, use_cache=False).logits
    (_loss_sum(logits, targets) / (targets != -100).sum()).backward()
    return model, inputs, positions, targets, logits.detach()


class AttentionCalls:
    """Counts calls of the registered easy_context attention function and the keyword names it receives."""

    def __init__(self, name: str):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.name, self.registry, self.calls, self.kwargs = name, ALL_ATTENTION_FUNCTIONS, 0, set()
        self.original = ALL_ATTENTION_FUNCTIONS[name]

    def __enter__(self) -> AttentionCalls:
        def counted(*args, **kwargs):
            self.calls += 1
            self.kwargs |= {k for k, v in kwargs.items() if v is not None}
            return self.original(*args, **kwargs)

        self.registry[self.name] = counted
        return self

    def __exit__(self, *exc) -> None:
        self.registry[self.name] = self.original


def sp_errors(rank: int, world: int, family: str, algo: str = "zigzag_ring_attn", **opts) -> dict[str, Any]:
    """Logits and gradient errors of ``family`` under ``algo`` on this rank against the single-process model."""
    import easy_context as ec

    ref_model, inputs, positions, targets, ref_logits = reference(family)
    sharded = ec.get_seq_algo(algo).distributed
    model = tiny_model(family)  # fresh, not a copy: nothing the reference forward cached (RoPE tables) carries over
    ec.apply_seq_parallel_monkey_patch(algo, model, **opts)
    name = model.config._attn_implementation
    if sharded:
        local = ec.prepare_seq_parallel_inputs(algo, inputs, positions, targets, rank, world, "cpu")
        ids, pos, tgt = local["local_input_ids"], local["local_position_ids"], local["local_target_ids"]
    else:
        ids, pos, tgt = inputs, positions, targets
    with AttentionCalls(name) if name.startswith("easy_context_") else contextlib.nullcontext() as calls:
        logits = model(ids, position_ids=pos).logits
    (_loss_sum(logits, tgt) / (targets != -100).sum()).backward()
    ref_local = ec.extract_local(algo, ref_logits, rank, world) if sharded else ref_logits
    errs = {"logits": rel_err(logits, ref_local), **_grad_errors(model, ref_model, reduce=sharded)}
    if calls is None:  # easy_context left the model's own attention (an older easy_context did so silently)
        return {**_summary(errs), "attention_calls": 0, "attention_kwargs": [], "kept": name}
    return {**_summary(errs), "attention_calls": calls.calls, "attention_kwargs": sorted(calls.kwargs)}


def loss_errors(family: str) -> dict[str, Any]:
    """``CausalLMWithLoss`` (train.py's loss: sum and count) against the model's own ``labels=`` loss, one process."""
    from easy_context.loss import CausalLMWithLoss

    model = tiny_model(family)
    inputs, targets = batch()
    positions = torch.arange(SEQ).expand_as(inputs)
    # the model shifts labels itself: labels[:, t + 1] is the target of position t; the last position has none
    labels = torch.cat([torch.full_like(targets[:, :1], -100), targets[:, :-1]], dim=1)
    wrapped_model = tiny_model(family)
    ref = model(inputs, position_ids=positions, labels=labels, use_cache=False).loss
    ref.backward()
    wrapped = CausalLMWithLoss(wrapped_model)
    tgt = targets.clone()
    tgt[:, -1] = -100
    loss_sum, count = wrapped(inputs, positions, tgt)
    (loss_sum / count).backward()
    errs = {"logits": rel_err(loss_sum / count, ref.detach()), **_grad_errors(wrapped_model, model, reduce=False)}
    out = _summary(errs)
    out["loss"] = out.pop("logits")
    return out


def fp32_noise(family: str) -> dict[str, Any]:
    """How far the fp32 eager model itself is from the same model in fp64 (logits, worst gradient): the rounding
    floor any fp32 implementation of this family shares."""
    model32, *_, logits32 = reference(family)
    model64, *_, logits64 = reference(family, torch.float64)
    errs = {"logits": rel_err(logits32, logits64), **_grad_errors(model32, model64, reduce=False)}
    return _summary(errs)


def _refusal(exc: BaseException) -> str | None:
    """easy_context's own error (raised in an easy_context frame), as one line; None for any other error."""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and f"{os.sep}easy_context{os.sep}" in frames[-1].filename:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _attempt(fn, *args, **kwargs) -> dict[str, Any]:
    try:
        return {"ok": True, **fn(*args, **kwargs)}
    except Exception as exc:
        refused = _refusal(exc)
        return {"ok": False, "refused": refused, "error": None if refused else f"{type(exc).__name__}: {exc}"[:400],
                "traceback": traceback.format_exc()[-2000:]}  # fmt: skip


def zoo_worker(rank: int, world: int, family: str) -> dict[str, Any]:
    """One family on every rank: zigzag on the world; rank 0 also data_parallel, the last rank the loss check."""
    import transformers

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity(transformers.logging.CRITICAL)
    try:
        tiny_model(family)
    except Exception as exc:
        return {"built": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
    out: dict[str, Any] = {"built": True, "zigzag_ring_attn": _attempt(sp_errors, rank, world, family)}
    if rank == 0:
        out["data_parallel"] = _attempt(sp_errors, rank, world, family, "data_parallel", always=True)
    if rank == world - 1:
        out["loss"] = _attempt(loss_errors, family)
        out["fp32_noise"] = _attempt(fp32_noise, family)
    return out


def _check(results: list[dict[str, Any]], key: str = "logits", tolerance: float = TOLERANCE) -> dict[str, Any]:
    """One check (its ranks' results merged): {status: pass / fail / refused / error, reason, numbers}."""
    bad = next((r for r in results if not r["ok"]), None)
    if bad is not None:
        if bad["refused"]:
            return {"status": "refused", "reason": bad["refused"]}
        return {"status": "error", "reason": bad["error"], "traceback": bad["traceback"]}
    worst = max(results, key=lambda r: r["grad"])
    out = {key: max(r[key] for r in results), "grad": worst["grad"], "worst_grad": worst["worst_grad"]}
    ok = max(out[key], out["grad"]) < tolerance
    if "attention_calls" in results[0]:
        out.update(attention_calls=results[0]["attention_calls"], attention_kwargs=results[0]["attention_kwargs"])
        if results[0]["attention_calls"] == 0:
            why = f"kept its own attention '{results[0]['kept']}'" if "kept" in results[0] else "never called it"
            return {**out, "status": "fail", "reason": f"not run by easy_context attention ({why}): logits "
                    f"{out[key]:.1e}, grad {out['grad']:.1e}"}  # fmt: skip
    reason = "" if ok else f"{key} {out[key]:.1e}, grad {out['grad']:.1e} ({out['worst_grad']})"
    return {**out, "status": "pass" if ok else "fail", "reason": reason}


def verdict(family: str, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the ranks' results of one family: each check's result and the family's status (the worst of its
    sequence-parallel checks; a failed loss check fails it too, a refused one is noted)."""
    first = per_rank[0]
    if not first.get("built"):
        return {"family": family, "status": "skipped", "reason": f"cannot build tiny: {first.get('error')}"}
    noise = per_rank[-1]["fp32_noise"]
    noise_level = max(noise["logits"], noise["grad"]) if noise["ok"] else 0.0
    tol = max(TOLERANCE, NOISE_FACTOR * noise_level)
    checks = {"zigzag_ring_attn": _check([r["zigzag_ring_attn"] for r in per_rank], tolerance=tol),
              "data_parallel": _check([per_rank[0]["data_parallel"]], tolerance=tol),
              "loss": _check([per_rank[-1]["loss"]], key="loss", tolerance=tol)}  # fmt: skip
    sp = [checks["zigzag_ring_attn"], checks["data_parallel"]]
    order = ("error", "refused", "fail", "pass")
    status = min((c["status"] for c in sp), key=order.index)
    if status == "pass" and checks["loss"]["status"] in ("fail", "error"):
        status = checks["loss"]["status"]
    reason = next((f"{name}: {c['reason']}" for name, c in checks.items() if c["status"] == status and c["reason"]),
                  "")  # fmt: skip
    if status == "pass" and checks["loss"]["status"] == "refused":
        reason = f"loss: {checks['loss']['reason']}"
    noise_row = {k: noise[k] for k in ("logits", "grad", "worst_grad")} if noise["ok"] else {"error": noise["error"]}
    return {"family": family, "status": status, "reason": reason, "tolerance": tol, "fp32_noise": noise_row, **checks}


SHORT_REASONS = (
    ("without calling easy_context", "forward never calls attention (recurrent blocks)"),
    ("in its own code", "attention not through AttentionInterface"),
    ("made its own", "builds its own attention mask (dynamic mask)"),
    ("more than a linear map", "output layer is not a plain Linear"),
    ("outside its decoder and output", "a prediction head between decoder and output layer"),
)


def _short(row: dict[str, Any]) -> str:
    """A table cell for a refused / skipped / failed family's reason."""
    reason = row.get("reason", "")
    kinds = re.findall(r"'([a-z_]+)': ", reason)
    if "config.layer_types" in reason and kinds:
        return "layer kinds " + ", ".join(f"`{k}`" for k in kinds)
    scaled = re.search(r"config\.(\w+)=", reason)
    if "scale their logits" in reason and scaled:
        return f"logit scaling (`{scaled.group(1)}`)"
    for needle, text in SHORT_REASONS:
        if needle in reason:
            return text
    return reason.split(": ", 1)[-1][:110].replace("|", "/").replace("\n", " ")


def _cell(check: dict[str, Any], key: str = "logits") -> str:
    if check["status"] in ("pass", "fail"):
        return f"{check['status']} {check[key]:.0e} / {check['grad']:.0e}"
    return check["status"]


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table: one row per family."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as classes

    lines = ["| family | class | result | zigzag, 2 ranks (logits / grad) | data_parallel | CausalLMWithLoss | note |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in report["families"]:
        model_type = VARIANTS.get(row["family"], (row["family"],))[0]
        cls = classes.get(model_type, "")
        if "zigzag_ring_attn" in row and row["status"] in ("pass", "fail"):
            loss, noise = row["loss"], row["fp32_noise"].get("grad", 0.0)
            loss_cell = _cell(loss, "loss") if loss["status"] in ("pass", "fail") else f"refused: {_short(loss)}"
            cells = [_cell(row["zigzag_ring_attn"]), _cell(row["data_parallel"]), loss_cell]
            note = (
                f"tolerance {row['tolerance']:.0e}: fp32 eager vs fp64 {noise:.0e}"
                if row["tolerance"] > TOLERANCE
                else ""
            )
        else:
            cells, note = ["", "", ""], _short(row)
        lines.append(f"| {row['family']} | {cls} | {row['status']} | " + " | ".join(cells) + f" | {note} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="", help="comma-separated families (default: all)")
    parser.add_argument("--json", default="results/cpu/model_zoo.json")
    parser.add_argument("--markdown", default="", help="also write the table (docs/models.md includes it) here")
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import transformers

    from tests.support.dist_pool import DistPool

    transformers.logging.set_verbosity(transformers.logging.CRITICAL)
    names = [f for f in args.families.split(",") if f] or families()
    rows, pool, start = [], None, time.time()
    for family in names:
        if family in NOT_DECODERS:
            rows.append({"family": family, "status": "skipped", "reason": NOT_DECODERS[family]})
        else:
            if pool is None or not pool.alive:
                pool = DistPool(args.world)
            t0 = time.time()
            try:
                rows.append(verdict(family, pool.run(zoo_worker, family, timeout=300)))
            except Exception as exc:  # a hang or a crash of a rank
                rows.append({"family": family, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:300]})
            rows[-1]["seconds"] = round(time.time() - t0, 1)
        row = rows[-1]
        print(f"{row['family']:28s} {row['status']:8s} {row.get('reason', '')[:150]}", flush=True)
    if pool is not None:
        pool.close()
    summary = {s: sum(r["status"] == s for r in rows) for s in ("pass", "fail", "refused", "error", "skipped")}
    print(f"\n{summary}  ({time.time() - start:.0f} s)")
    report = {"date": datetime.date.today().isoformat(), "transformers": transformers.__version__,
              "torch": torch.__version__, "world": args.world, "tolerance": TOLERANCE, "summary": summary,
              "families": rows}  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:  # one line per family
            head = json.dumps({k: v for k, v in report.items() if k != "families"})[:-1]
            f.write(head + ', "families": [\n' + ",\n".join(json.dumps(r) for r in rows) + "\n]}\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(report))


if __name__ == "__main__":
    main()
