"""Derived recipes run: for a tiny random model of four families, ``easy_context.extend.derive`` picks the layout for
2 "GPUs" whose memory the data-parallel layout overflows at the target, and ``python -m easy_context.extend --recipe``
runs the recipe's training stages on 2 CPU processes (``ONLY=train``): the SP backend, optimizer placement,
checkpointing, stages and steps the recipe names are what train.py ran, and the loss of each stage is finite.

The memory: the planner's bytes of the data-parallel layout at the target, less a margin that makes the planner pick
what each family is here to exercise (Ulysses where the heads divide 2, the zigzag ring where they do not, DeepSpeed
ZeRO-3, offloaded layer inputs); the test scans the margin and asserts the pick.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from easy_context.extend.derive import derive
from tests.support import zygote
from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]
NATIVE, TARGET = 256, 2048
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
FAMILIES = {  # name -> (config, what the planner is to pick: parallel mode, optimizer placement, checkpointing)
    "llama": (dict(model_type="llama", **TINY), ("ulysses_attn", "ddp", "full")),
    "qwen2": (dict(model_type="qwen2", **TINY), ("ulysses_attn", "zero3", "full")),  # DeepSpeed ZeRO-3 on CPU
    "mistral": (dict(model_type="mistral", **{**TINY, "num_attention_heads": 6, "num_key_value_heads": 3},
                     head_dim=16, sliding_window=None), ("zigzag_ring_attn", "ddp", "full")),  # 3 KV heads: no Ulysses
    "gemma3": (dict(model_type="gemma3_text", **{**TINY, "num_key_value_heads": 1}, head_dim=16, sliding_window=64,
                    layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=16),
               ("ulysses_attn", "ddp", "offload")),  # one sliding-window layer, one global
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A 1,000-token BPE of the essays (the pipeline's CPU miniature's own), trained once for the four models."""
    from easy_context.data.tokenizer import train_byte_level_bpe

    texts = [f.read_text(encoding="utf-8") for f in sorted((ROOT / "PaulGrahamEssays").glob("*.txt"))]
    return train_byte_level_bpe(texts, 1000, str(tmp_path_factory.mktemp("tokenizer")))


@pytest.fixture(scope="module")
def packed() -> dict[str, Path]:
    """The corpus and its packings of the first run, copied into the next runs' WORK: the four models share one
    tokenizer, so the pipeline skips packing the same rows again."""
    return {}


def tiny_model(config: dict, tokenizer, out: Path) -> Path:
    """A random model of ``config`` at the native length with the tokenizer, saved into ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from easy_context.models import match_special_tokens

    values = dict(config)
    full = AutoConfig.for_model(values.pop("model_type"), vocab_size=len(tokenizer), max_position_embeddings=NATIVE,
                                **values)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(full)
    match_special_tokens(model, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def derived_for(config: dict, want: tuple[str, str, str]):
    """The derived recipe for 2 GPUs of the memory (scanned below the data-parallel bytes) at which the planner picks
    ``want``; fails when no memory does."""
    full = dict(config, vocab_size=1000, max_position_embeddings=NATIVE)
    roomy = derive(dict(full), TARGET, gpus=2, gpu_mem="80GB", host_mem="8GB")
    assert roomy.recipe.parallel_mode == "data_parallel"  # with room, no SP
    dp_bytes = roomy.plans[-1].gpu_bytes
    for margin in range(1, 121):
        try:
            d = derive(dict(full), TARGET, gpus=2, gpu_mem=dp_bytes - margin * 5e4, host_mem="8GB", name="tiny")
        except ValueError:
            continue
        if (d.recipe.parallel_mode, d.recipe.settings["optim"], d.recipe.checkpointing) == want:
            return d
    raise AssertionError(f"no GPU memory below {dp_bytes:.0f} B makes the planner pick {want}")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_derived_recipe_trains_its_stages_on_two_cpu_processes(tmp_path, family, tokenizer, packed):
    config, want = FAMILIES[family]
    derived = derived_for(config, want)
    recipe = derived.recipe
    assert recipe.settings["nproc"] == 2 and [s.seq_length for s in recipe.all_stages] == [4 * NATIVE, TARGET]
    # the recipe itself at its own (tiny) lengths: without its micro: section, MICRO=1 keeps them (CPU saves only)
    recipe = recipe.with_(settings={k: v for k, v in recipe.settings.items() if k != "micro"})
    path = recipe.write(tmp_path / "recipe.yaml")
    work = tmp_path / "w"
    work.mkdir()
    base = tiny_model(config, tokenizer, tmp_path / "base")
    for name, source in packed.items():
        (shutil.copytree if source.is_dir() else shutil.copy)(source, work / name)
    env = {**os.environ, "DEVICE": "cpu", "MICRO": "1", "MODEL": str(base), "ONLY": "train", "WORK": str(work),
           "PY": zygote.python(), "CORPUS_CHARS": "3e5", "NUM_PROC": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
    res = run_job([zygote.python(), "-m", "easy_context.extend", "--recipe", str(path)], cwd=ROOT, env=env,
                  timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    stages = dict(line.split("\t")[:2] for line in (work / "results" / "stages.tsv").read_text().splitlines())
    first = f"stage1_{4 * NATIVE}"
    logs = {f.name: f.read_text()[-3000:] for f in (work / "logs").glob("*.log")}
    assert stages.get(first) == "0" and stages.get("extended") == "0", (stages, logs)
    assert set(stages) - {"corpus", f"data_{4 * NATIVE}", f"data_{TARGET}"} == {first, "extended"}  # ONLY=train
    if not packed:
        packed.update({f.name: f for f in (work / "code.jsonl", work / f"data_{4 * NATIVE}", work / f"data_{TARGET}")})
    mode, optim, checkpointing = want
    for name, stage in ((first, recipe.stages[0]), ("extended", recipe.all_stages[-1])):
        out = work / name
        assert (out / "train_done").is_file() and (out / "config.json").is_file()
        args = json.loads((out / "run_config.json").read_text())
        assert args["launch"]["processes"] == 2
        assert args["args"]["parallel_mode"] == mode and args["args"]["seq_length"] == stage.seq_length
        assert args["launch"]["sp_size"] == 2 and ("DEEPSPEED" in args["launch"]["engine"]) == (optim == "zero3")
        assert args["args"]["checkpointing"] == (stage.checkpointing or recipe.checkpointing)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows][-1] == stage.steps and all(0 < r["loss"] < 20 for r in rows), rows
    model = json.loads((work / "extended" / "config.json").read_text())
    assert model["model_type"] == config["model_type"]
    thetas = model.get("rope_parameters") or {}
    full = thetas.get("full_attention", thetas)  # Gemma 3: the global layers' base
    assert full["rope_theta"] == recipe.rope_theta


def test_the_cpu_miniature_of_a_derived_plan_runs_its_stages(tmp_path):
    """``--micro``: the derived plan's own ``micro:`` section (a tiny random model of the same family and head
    ratio, the plan's backend on its processes, lengths doubling per stage) trains every stage (``ONLY=train``)."""
    config, want = FAMILIES["llama"]
    recipe = derived_for(config, want).recipe
    micro = recipe.settings["micro"]
    path = recipe.write(tmp_path / "recipe.yaml")
    work = tmp_path / "w"
    env = {**os.environ, "ONLY": "train", "WORK": str(work), "PY": zygote.python(), "CORPUS_CHARS": "3e5",
           "NUM_PROC": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
    res = run_job([zygote.python(), "-m", "easy_context.extend", "--recipe", str(path), "--micro"], cwd=ROOT, env=env,
                  timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "every training run passes train.py's layout check" in res.stdout
    stages = dict(line.split("\t")[:2] for line in (work / "results" / "stages.tsv").read_text().splitlines())
    first = f"stage1_{micro['stages'][0]['seq-length']}"
    assert stages.get("model") == stages.get(first) == stages.get("extended") == "0", stages
    model = json.loads((work / "extended" / "config.json").read_text())
    assert (
        model["model_type"] == "llama" and model["num_attention_heads"] == micro["micro_model"]["num_attention_heads"]
    )
    for name, length in ((first, micro["stages"][0]["seq-length"]), ("extended", micro["target"])):
        args = json.loads((work / name / "run_config.json").read_text())
        assert args["launch"]["processes"] == micro["nproc"] == 2 and args["args"]["parallel_mode"] == want[0]
        assert args["args"]["seq_length"] == length and args["args"]["checkpointing"] == recipe.checkpointing
        rows = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["step"] == 3 and all(0 < r["loss"] < 20 for r in rows), rows
