"""The plan tells the truth about itself (``python -m easy_context.extend``): a recipe says each setting once and its
dry run describes what would run; the advice of a refusal names a value that fits (planned again here) or says none
does; dominating evaluations come with the settings that cut them, and those settings give the estimate promised;
an error names the flag the user typed."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from easy_context.extend.cli import main
from easy_context.extend.estimate import EVAL_CUTS
from easy_context.extend.settings import resolve

SMOLLM2 = dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, rope_theta=1e5, vocab_size=49152, max_position_embeddings=8192,
               tie_word_embeddings=True)  # fmt: skip
PLAN = ["--to", "64K", "--gpus", "2", "--host-mem", "128GB", "--dry-run"]


@pytest.fixture
def smol(tmp_path, monkeypatch) -> str:
    for name in (*EVAL_CUTS, "PARALLEL_MODE", "NPROC", "MICRO"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "smol").mkdir()
    (tmp_path / "smol" / "config.json").write_text(json.dumps(SMOLLM2))
    return str(tmp_path / "smol")


def test_a_recipe_says_its_backend_once_and_the_dry_run_follows_an_edit(smol, tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "r.yaml")
    assert main(["--model", smol, *PLAN, "--write-recipe", path]) == 0
    capsys.readouterr()
    written = yaml.safe_load(open(path))
    assert written["parallel_mode"] == "data_parallel" and "parallel_mode" not in written["pipeline"]
    edited = open(path).read().replace("parallel_mode: data_parallel", "parallel_mode: zigzag_ring_attn")
    with open(path, "w") as f:  # the user edits the one place
        f.write(edited)
    assert main(["--recipe", path, "--dry-run"]) == 0
    header, *_, layout = capsys.readouterr().out.strip().splitlines()
    backend = re.search(r"zigzag_ring_attn on 2 processes \(SP 1 x DP 2\)", header)  # the recipe's sp-size 1
    assert backend and backend[0] in layout and "data_parallel" not in header + layout  # every line: what would run
    assert resolve(path).par == ["--parallel_mode", "zigzag_ring_attn"]  # what the pipeline passes train.py
    monkeypatch.setenv("PARALLEL_MODE", "ulysses_attn")  # the environment wins, and the dry run says so
    assert main(["--recipe", path, "--dry-run"]) == 0
    assert "ulysses_attn on 2 processes" in capsys.readouterr().out.splitlines()[0]
    monkeypatch.delenv("PARALLEL_MODE")
    text = open(path).read().replace("pipeline:\n", "pipeline:\n  parallel_mode: ulysses_attn\n", 1)
    with open(path, "w") as f:  # a second answer that disagrees: refused in one line naming both
        f.write(text)
    with pytest.raises(SystemExit):
        main(["--recipe", path, "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the recipe sets parallel_mode twice, parallel_mode: zigzag_ring_attn at the top and " in err
    assert "pipeline.parallel_mode: ulysses_attn under it; keep one" in err
    with open(path, "w") as f:  # the same answer twice (a recipe written before): accepted
        f.write(text.replace("  parallel_mode: ulysses_attn\n", "  parallel_mode: zigzag_ring_attn\n"))
    assert main(["--recipe", path, "--dry-run"]) == 0


def test_dominating_evaluations_name_the_settings_that_cut_them_and_those_give_the_estimate(smol, monkeypatch,
                                                                                            capsys):  # fmt: skip
    """SmolLM2 to 64K on 2 GPUs: ~2 min of training, ~14 min of evaluations on one GPU. The line names EVAL_CUTS and
    their estimate; the dry run under those settings prints that estimate as its evaluations and total."""
    assert main(["--model", smol, *PLAN]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "evaluations dominate" in line)
    assert "run on one GPU of the 2: the pipeline starts each as one process, whatever --gpus" in line
    assert "RULER=0 LONG=0 BASELINES=base SAMPLES=1 cut them to ~" in line
    promised, total = re.search(r"cut them to ~([\d.]+ \w+) \(in all ~([\d.]+ \w+)\)", line).groups()
    for name, value in EVAL_CUTS.items():
        monkeypatch.setenv(name, value)
    assert main(["--model", smol, *PLAN]) == 0
    out = capsys.readouterr().out
    assert f"  evaluations: ~{promised} (" in out and f"in all: 9.7M tokens trained, ~{total} (" in out, out
    assert "evaluations dominate" not in out  # cut below the training's time: nothing more to say


def test_a_refusal_advises_the_knob_that_fits_or_says_none_does(smol, capsys):
    """Host memory too small for even the weights: the advice is more host memory (not more GPUs, each of which
    needs its own), and the plan with it goes through; a length no hardware reaches: no knob."""
    with pytest.raises(SystemExit):
        main(["--model", smol, "--to", "64K", "--host-mem", "2GB", "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "; planned again, it fits with --host-mem 4GB a node (see" in err and "--gpus" not in err, err
    assert main(["--model", smol, "--to", "64K", "--host-mem", "4GB", "--dry-run"]) == 0
    with pytest.raises(SystemExit):
        main(["--model", smol, "--to", "64K", "--host-mem", "2GB", "--gpus", "2", "--dry-run"])
    assert "--gpus 4" not in capsys.readouterr().err  # more GPUs never fit there
    with pytest.raises(SystemExit):
        main(["--model", smol, "--to", "99999999999", "--host-mem", "128GB", "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no knob makes it fit (planned again with --gpus 64, --host-mem 8.192TB, --gpu b200" in err, err
    assert "give a shorter --to (see" in err


def test_a_missing_recipe_names_the_flag_typed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["--recipe", "nope.yaml"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: --recipe nope.yaml: No such file or directory (see" in err and "--config" not in err, err
