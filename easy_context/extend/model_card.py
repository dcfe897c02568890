"""The model card (README.md, the hub's convention) of an extended model, written into its folder from the evidence
the pipeline leaves: the model's config.json, each training run's run_config.json (:mod:`easy_context.extend.lineage`),
and the summary (summary.json, :mod:`easy_context.eval.compare`).

    python -m easy_context.extend.model_card WORK [--model extended] [--results WORK/results] [--hardware TEXT]

(also ``easy-context-card``). The card: YAML front matter (base_model and license where the base is a known fetch
source, :data:`easy_context.models.fetch.SOURCES`; library_name, tags, the trained context length), the RoPE, the
training runs (data, lengths, steps, tokens, time), the evaluation (the gain over the best training-free baseline,
with its caveats, and perplexity), the hardware, and how to load the model in transformers 4.x / 5.x, vLLM and
llama.cpp / ollama (through ``easy-context-export``'s GGUF).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from easy_context.eval.compare import _k, gain_markdown
from easy_context.eval.gain import BEYOND, headline, training_free
from easy_context.extend.lineage import runs, source_gguf

CARD = "README.md"
TAGS = ("long-context", "easy_context")
LEGACY_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_local_base_freq")  # what transformers 4.x reads


def _source(model_dir: str):
    """The fetch source (:data:`easy_context.models.fetch.SOURCES`) the model's base came from, or None."""
    from easy_context.models.fetch import SOURCES

    path = source_gguf(model_dir)
    name = os.path.basename(path) if path else None
    return next((s for s in SOURCES if s.gguf == name), None)


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def rope_text(config: dict) -> str:
    """``rope_parameters`` in words: one RoPE, or one per layer type."""
    params = config.get("rope_parameters") or {}

    def one(p: dict) -> str:
        extra = [f"{k} {_num(v)}" for k, v in p.items() if k not in ("rope_type", "rope_theta")]
        kind = p.get("rope_type", "default")
        return f"base {_num(p.get('rope_theta'))}" + (f", {kind} scaling ({', '.join(extra)})" if kind != "default"
                                                        else "")  # fmt: skip

    if params and all(isinstance(v, dict) for v in params.values()):
        return "; ".join(f"{layer_type} layers: {one(p)}" for layer_type, p in params.items())
    return one(params)


def front_matter(config: dict, source) -> list[str]:
    lines = ["---"]
    if source is not None and source.base_model:
        lines.append(f"base_model: {source.base_model}")
    lines.append("library_name: transformers")
    if source is not None and source.license_id:
        lines.append(f"license: {source.license_id}")
    lines += ["pipeline_tag: text-generation", "tags:", *(f"- {t}" for t in TAGS)]
    lines += [f"context_length: {int(config['max_position_embeddings'])}", "---", ""]
    return lines


def _cell(row: dict, key: str, fmt: str = "{}") -> str:
    return fmt.format(row[key]) if row.get(key) is not None else "—"


def training_section(chain, summary: dict | None) -> list[str]:
    """One row per training run (first first): its length, steps, tokens, time, speed, memory, loss, data."""
    if not chain:
        return ["## Training", "", "No run_config.json in the folder: how it was trained is not recorded.", ""]
    stages = (summary or {}).get("training_stages") or {}
    if not stages and (summary or {}).get("training"):
        stages = {os.path.basename(os.path.normpath(chain[-1].folder)): summary["training"]}
    lines = ["## Training", "",
             "Full fine-tuning with easy_context (sequence parallelism: every token attends over the whole sequence).",
             "", "| run | length | steps | tokens | time (s) | tokens/s | peak memory (GiB) | final loss "
             "| learning rate | RoPE base | data |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for run in chain:
        name = os.path.basename(os.path.normpath(run.folder))
        t, a = stages.get(name, {}), run.args
        cells = [_cell(t, "tokens", "{:,}"), _cell(t, "train_seconds", "{:.0f}"), _cell(t, "tokens_per_s", "{:,.0f}"),
                 _cell(t, "peak_mem_gib"), _cell(t, "loss")]  # fmt: skip
        steps = _cell(t, "steps") if t else str(a.get("max_train_steps") or "—")
        data = os.path.basename(os.path.normpath(str(a.get("dataset") or "—")))
        lines.append(f"| {name} | {a.get('seq_length', '—')} | {steps} | {' | '.join(cells)} | "
                     f"{_num(a.get('learning_rate', '—'))} | {_num(a.get('rope_theta', '—'))} | {data} |")  # fmt: skip
    first = chain[0].args
    lines += ["", f"Started from `{first.get('model')}`. Data: the prepared datasets named in the table "
              "(`python -m easy_context.data`: documents packed into rows of length + 1 tokens).", ""]  # fmt: skip
    return lines


def evaluation_section(summary: dict | None) -> list[str]:
    """The gain over the best training-free baseline (summary.json's rows, as summary.md prints them), its caveats,
    and perplexity."""
    if summary is None:
        return ["## Evaluation", "", "No summary.json: this model was not evaluated by the pipeline.", ""]
    models = summary["models"]
    rows = summary.get("gain_over_best_baseline") or []
    lines = ["## Evaluation", "", headline(models).lstrip("# "), ""]
    lines += gain_markdown(rows, len(training_free(models)))
    prompts = {n: m["needle"]["prompts"] for n, m in models.items() if m.get("needle")}
    samples = sorted({c for m in models.values() for r in [(m.get("ruler") or {}).get("samples") or {}]
                      for row in r.values() for c in row.values()})  # fmt: skip
    counts = "/".join(sorted(set(map(str, prompts.values()))))
    ruler = f", {'/'.join(map(str, samples))} RULER-style prompts a cell" if samples else ""
    lines += ["Caveats:", "",
              f"- Synthetic tasks on the same prompts for every model: the needle in essays ({counts} prompts a model"
              f"{ruler}); "
              "with this few prompts a difference of one answer in a cell is noise.",
              "- Best baseline = the highest training-free score in each cell (picked per cell, after the fact): the "
              "gain is a lower bound on what training adds over any one baseline.",
              f"- Base length {_k(summary['base_length'])}, trained length "
              f"{_k(summary['target_length'])}."]  # fmt: skip
    if any(r["task"].startswith(BEYOND) for r in rows):
        lines.append("- Needle beyond the trained length: no training there; RoPE scaling at inference only.")
    ppl = {n: m for n, m in models.items() if m.get("ppl") or m.get("ppl_short")}
    if ppl:
        lengths = sorted({int(n) for m in ppl.values() for n in (m.get("ppl") or {})})
        lines += ["", "Perplexity on held-out essays (short windows, then the first window of each length):", "",
                  "| model | short | " + " | ".join(_k(n) for n in lengths) + " |",
                  "| --- | --- |" + " --- |" * len(lengths)]  # fmt: skip
        for name, m in ppl.items():
            short = next(iter((m.get("ppl_short") or {}).values()), None)
            by = {int(n): v for n, v in (m.get("ppl") or {}).items()}
            lines.append(f"| {name} | {_num(short) if short is not None else '—'} | "
                         + " | ".join(_num(by[n]) if n in by else "—" for n in lengths) + " |")  # fmt: skip
    return [*lines, ""]


def hardware_section(chain, summary: dict | None, hardware: str | None) -> list[str]:
    t = (summary or {}).get("training_stages") or {}
    total = sum(s.get("train_seconds") or 0 for s in t.values()) or ((summary or {}).get("training") or {}).get(
        "train_seconds"
    )
    lines = ["## Hardware and time", ""]
    if hardware:
        lines.append(f"- Hardware: {hardware}.")
    if chain:
        a = chain[-1].args
        lines.append(f"- Layout: {a.get('parallel_mode', '—')}, kernel {a.get('kernel', '—')}, "
                     f"checkpointing {a.get('checkpointing', '—')}, dtype {a.get('dtype', '—')}.")  # fmt: skip
    if total:
        lines.append(f"- Training time: {total:.0f} s (the training loops, all runs).")
    return [*lines, ""]


def usage_section(model_dir: str, config: dict) -> list[str]:
    """How to load the model: transformers 5.x and 4.x, vLLM, llama.cpp and ollama."""
    path = os.path.abspath(model_dir)
    length = int(config["max_position_embeddings"])
    legacy = [k for k in LEGACY_ROPE_KEYS if k in config]
    gemma = config.get("model_type", "").startswith("gemma3")
    four = '"transformers>=4.50,<5"' if gemma else '"transformers<5"'
    if legacy:
        four_note = (f"transformers 4.x reads the same RoPE from the keys config.json carries for it "
                     f"({', '.join(legacy)}) beside transformers 5's `rope_parameters`.")  # fmt: skip
    else:
        four_note = ("Caution: config.json holds only transformers 5's `rope_parameters`; transformers 4.x (and "
                     "stacks pinned to it) would load the family's default RoPE base, not the trained "
                     "one.")  # fmt: skip
    gguf = os.path.basename(os.path.normpath(model_dir)) + "-q8_0.gguf"
    return [
        "## Use", "",
        f"transformers 5.x (the trained RoPE is in config.json's `rope_parameters`; up to {length:,} tokens):", "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'path = "{path}"  # or its hub id',
        "tokenizer = AutoTokenizer.from_pretrained(path)",
        'model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")',
        "```", "",
        f"transformers 4.x (`pip install {four}`): the same code. {four_note}", "",
        "vLLM:", "", "```bash", f"vllm serve {path} --max-model-len {length}", "```", "",
        "llama.cpp / ollama: export a GGUF (the trained context length and RoPE go into its metadata), then run it:",
        "", "```bash", f"easy-context-export {path} --gguf {gguf} --type q8_0",
        f"llama-server -m {gguf} -c {length}", "```", "",
        f"ollama: a Modelfile with `FROM ./{gguf}` and `PARAMETER num_ctx {length}`.", "",
    ]  # fmt: skip


def card(model_dir: str, summary: dict | None = None, hardware: str | None = None) -> str:
    """The model card of ``model_dir`` (markdown with YAML front matter). ``summary``: the pipeline's summary.json."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config: dict[str, Any] = json.load(f)
    chain, base = runs(model_dir)
    source = _source(model_dir)
    title = source.title if source is not None else os.path.basename(os.path.normpath(base or "")) or "a model"
    length = int(config["max_position_embeddings"])
    lines = front_matter(config, source)
    lines += [f"# {os.path.basename(os.path.normpath(model_dir))}: {title}, extended to {length:,} tokens", "",
              f"A {config.get('model_type')} model whose context was extended by continued training with easy_context"
              + (f" from {_k(summary['base_length'])} to {_k(summary['target_length'])} tokens" if summary else "")
              + f". RoPE: {rope_text(config)}.", ""]  # fmt: skip
    if source is not None:
        lines += [f"Base: {source.title}; license: {source.license}.", ""]
    lines += training_section(chain, summary)
    lines += evaluation_section(summary)
    lines += hardware_section(chain, summary, hardware)
    lines += usage_section(model_dir, config)
    return "\n".join(lines)


def write_card(work: str, model: str = "extended", results: str | None = None, hardware: str | None = None) -> str:
    """Write WORK/MODEL/README.md from WORK's evidence (summary.json in ``results``, default WORK/results); its path."""
    model_dir = model if os.path.isdir(model) else os.path.join(work, model)
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"{model_dir}: no config.json (the extended model's folder; --model names it)")
    path = os.path.join(results or os.path.join(work, "results"), "summary.json")
    summary = None
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
    out = os.path.join(model_dir, CARD)
    with open(out, "w", encoding="utf-8") as f:
        f.write(card(model_dir, summary, hardware))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m easy_context.extend.model_card", description=__doc__.splitlines()[0])
    p.add_argument("work", metavar="WORK", help="the pipeline's work folder")
    p.add_argument("--model", default="extended", help="the model's folder in WORK (or a path; default extended)")
    p.add_argument("--results", default=None, help="the folder holding summary.json (default WORK/results)")
    p.add_argument("--hardware", default=None, help="what it ran on, in words (e.g. '1x H200')")
    args = p.parse_args(argv)
    try:
        out = write_card(args.work, args.model, args.results, args.hardware)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
