"""The README demo's pipeline at a smaller scale: the shipped base model (trained at 256 tokens with the demo's
``BASE_MODEL=train`` recipe, assets/demo_base/README.md) -> needle + perplexity evaluation under 2-process SP -> data at
1024 tokens -> 2-process zigzag ring extension with a raised RoPE base -> save -> load -> the same evaluations ->
summary.json. The extension must show: retrieval beyond the base length up by >= 0.5, perplexity at the target
length below the base model's."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support import zygote
from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]
BASE_MODEL = ROOT / "assets" / "demo_base"


def test_shipped_base_model_is_complete():
    """The demo's default base: weights, config and its own tokenizer (the extension data is tokenized with it)."""
    names = {p.name for p in BASE_MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names, names
    config = json.loads((BASE_MODEL / "config.json").read_text())
    assert config["model_type"] == "llama" and config["rope_parameters"]["rope_theta"] == 10000


def test_demo_extension_grows_the_usable_context(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "OUT": str(out), "TARGET": "1024", "EXT_STEPS": "40", "SAMPLES": "1", "SEED": "0",
           "PY": os.environ.get("PYTHON", zygote.python())}  # fmt: skip  # the shim: each step forks, no import
    res = run_job(["bash", "train_scripts/demo_cpu.sh"], cwd=ROOT, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    before, after = summary["before"], summary["after"]
    assert summary["base_length"] == 256 and summary["target_length"] == 1024
    assert before["needle_within"] >= 0.8, summary  # the base retrieves within its training length...
    assert after["needle_beyond"] - before["needle_beyond"] >= 0.5, summary  # ...and the extension beyond it
    target_ppl = lambda s: s["ppl"][max(s["ppl"], key=int)]  # noqa: E731
    assert target_ppl(after) < target_ppl(before), summary
    assert (out / "extension.png").stat().st_size > 10_000
