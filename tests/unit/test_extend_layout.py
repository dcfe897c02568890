"""Every extension plan runs: a derived plan (any family, 1-8 GPUs) and its CPU miniature pass train.py's own layout
check (``train.check_layout``: the backend's length multiple, head split, GQA) for every training run; a ``--recipe``
that would not is refused before anything runs, in one line naming the fix. The names ``easy-context-fetch --list``
prints are ``--model`` names (derived from the source's shipped config, nothing downloaded). Refusals of launched
ranks other than 0 are quiet."""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace

import pytest

import train
from easy_context import cli as common_cli
from easy_context.extend import cli
from easy_context.extend.derive import derive, model_config
from easy_context.extend.micro import BASE, layer_period, micro_config
from easy_context.extend.preflight import preflight, training_runs
from easy_context.extend.settings import SettingsError, resolve
from easy_context.models.fetch import find_source
from easy_context.sp_config import sp_config_for
from tests.unit.test_extend_derive import GEMMA3, LLAMA3_8B, MISTRAL_7B, QWEN25_7B, SMOLLM2

K = 1024
# head_dim 64: a RoPE bound of derive's table (the scan of another rotary dim takes minutes)
TINY = dict(hidden_size=96, head_dim=64, intermediate_size=128, num_hidden_layers=2, vocab_size=1000,
            max_position_embeddings=256)  # fmt: skip
FAMILIES = {  # name -> (config, target factors over the native length: where derive's RoPE table has the bound)
    "smollm2": (SMOLLM2, (4, 8)),  # 9 q / 3 kv heads: Ulysses only where 3 divides the degree
    "gemma3": (GEMMA3, (4, 8)),  # 4 q / 1 kv, sliding-window layers
    "llama3_8b": (LLAMA3_8B, (4, 16)),
    "qwen2.5_7b": (QWEN25_7B, (2, 4)),  # 28 q / 4 kv
    "mistral_7b": (MISTRAL_7B, (4, 16)),
    "tiny_qwen2": (dict(model_type="qwen2", num_attention_heads=6, num_key_value_heads=2, **TINY), (4, 16)),
}


def train_py_accepts(config, mode: str, nproc: int, sp_size: int | None, length: int) -> None:
    """train.py's own check for one run (SystemExit with its one-line refusal otherwise)."""
    sp = sp_size or nproc
    layout = sp_config_for(mode, sp, dp_size=nproc // sp)
    train.check_layout(SimpleNamespace(seq_length=length), layout, config)


def every_run(recipe) -> list[int]:
    runs = [s.seq_length for s in recipe.all_stages]
    return runs + ([recipe.base_length] if recipe.settings.get("control", 1) else [])


def test_every_derived_plan_passes_train_pys_layout_check_on_1_to_8_gpus():
    checked, rounded, sp_plans = 0, 0, 0
    for name, (values, factors) in FAMILIES.items():
        config = model_config(dict(values))
        native = values["max_position_embeddings"]
        for gpus in range(1, 9):
            for factor in factors:
                try:
                    d = derive(dict(values), native * factor, gpus=gpus, gpu_mem="80GB", name=name)
                except ValueError as exc:
                    assert "does not fit" in str(exc), exc  # too long for this hardware: the only refusal
                    continue
                r = d.recipe
                nproc, mode = r.settings.get("nproc", 1), r.parallel_mode
                assert "parallel_mode" not in r.settings and r.target >= native * factor  # one place: the top
                for length in every_run(r):
                    train_py_accepts(config, mode, nproc, r.sp_size, length)
                checked += 1
                rounded += r.target != native * factor
                sp_plans += mode != "data_parallel"
                # its miniature too: the same backend on its own processes, the tiny model's heads
                m = r.settings["micro"]
                tiny = micro_config(m["micro_model"])
                for length in (
                    [s["seq-length"] for s in m["stages"]] + [m["target"]] + ([BASE] if m.get("control", 1) else [])
                ):
                    train_py_accepts(tiny, mode, m["nproc"], r.sp_size, length)
    assert checked >= 70 and sp_plans >= 30 and rounded >= 5, (checked, sp_plans, rounded)


def test_three_gpus_llama3_to_128k_picks_lengths_zigzag_can_shard():
    config = model_config(dict(LLAMA3_8B))
    with pytest.raises(SystemExit, match="--seq-length 131072 is not divisible by 6"):  # what derive gave before
        train_py_accepts(config, "zigzag_ring_attn", 3, None, 128 * K)
    d = derive(dict(LLAMA3_8B), 128 * K, gpus=3, name="llama3")
    r = d.recipe
    assert (r.parallel_mode, r.target, [s.seq_length for s in r.stages]) == ("zigzag_ring_attn", 131076, [32772])
    assert r.settings["control"] == 0 and "no multiple of 6" in r.why["pipeline.control"]  # 8192 % 6 != 0
    assert r.rope_theta == derive(dict(LLAMA3_8B), 128 * K, gpus=4).recipe.rope_theta  # the base of the asked 128K
    assert "lengths multiple of 6; every training run passes train.py's layout check" in d.layout


def write_recipe(tmp_path, nproc: int, mode: str, target: int, heads: int = 4, kv: int = 2) -> str:
    (tmp_path / "m").mkdir(exist_ok=True)
    values = {**TINY, "hidden_size": 32 * heads}
    config = dict(model_type="llama", num_attention_heads=heads, num_key_value_heads=kv, **values)
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    path = tmp_path / "r.yaml"
    pipeline = (
        f"  model: {tmp_path / 'm'}\n  base_length: 256\n  nproc: {nproc}\n  parallel_mode: {mode}\n  control: 0\n"
    )
    path.write_text(f"seq-length: {target}\nrope-theta: 1.0e+6\nparallel_mode: {mode}\npipeline:\n{pipeline}")
    return str(path)


@pytest.mark.parametrize(("nproc", "mode", "target", "heads", "kv", "want"), [
    (3, "zigzag_ring_attn", 1024, 4, 2, "extended at 1024 tokens cannot run as zigzag_ring_attn on 3 processes .* "
                                        "multiple of 6 there; fix: seq-length 1026"),
    (2, "ulysses_attn", 1024, 3, 3, "3 query heads are not divisible by the Ulysses degree 2; use usp_attn .* or "
                                    "zigzag_ring_attn"),
])  # fmt: skip
def test_a_recipe_train_py_would_refuse_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch, nproc, mode,
                                                                         target, heads, kv, want):  # fmt: skip
    path = write_recipe(tmp_path, nproc, mode, target, heads, kv)
    with pytest.raises(SystemExit):
        cli.main(["--recipe", path, "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(want, err[0]), err
    monkeypatch.setenv("WORK", str(tmp_path / "w"))
    from easy_context.extend import pipeline

    assert pipeline.main([path]) == 2 and not (tmp_path / "w").exists()  # nothing ran, no folder made
    assert "error: " in capsys.readouterr().err
    good = write_recipe(tmp_path, nproc, "zigzag_ring_attn", 1026 if nproc == 3 else 1024)
    assert cli.main(["--recipe", good, "--dry-run"]) == 0
    assert "every training run passes train.py's layout check" in capsys.readouterr().out


def test_the_preflight_lists_the_runs_the_pipeline_trains(tmp_path):
    path = write_recipe(tmp_path, 2, "zigzag_ring_attn", 1024)
    s = resolve(path, {"TARGET2": "2048"})
    assert [(r.name, r.seq_length) for r in training_runs(s)] == [("extended", 1024), ("extended_2048", 2048)]
    s = resolve(path, {"CONTROL": "1", "BASE_LENGTH": "250"})  # the control at the base length: 250 % 4
    with pytest.raises(SettingsError, match=r"control at 250 tokens .* multiple of 4 .*CONTROL=0"):
        preflight(s)


@pytest.mark.parametrize(("name", "values", "target"), [("smollm2-135m", SMOLLM2, 64 * K),
                                                        ("gemma3-270m", GEMMA3, 256 * K)])  # fmt: skip
def test_a_fetch_name_is_a_model_name(name, values, target, capsys):
    """Derived from the source's shipped config without a download: the same plan as from the model's published
    config.json values (test_extend_derive's)."""
    by_name, by_values = derive(name, target, gpu_mem="141GB"), derive(dict(values), target, gpu_mem="141GB")
    a, b = by_name.recipe, by_values.recipe
    assert (a.rope_theta, a.learning_rate, a.target, a.base_length) == (b.rope_theta, b.learning_rate, b.target,
                                                                         b.base_length)  # fmt: skip
    assert [s.seq_length for s in a.all_stages] == [s.seq_length for s in b.all_stages]
    assert [p.steps for p in by_name.plans] == [p.steps for p in by_values.plans]
    assert a.fetch == name and a.model == find_source(name).default_dest  # the pipeline fetches it there
    assert cli.main(["--model", name, "--to", str(target), "--gpu-mem", "141GB", "--dry-run"]) == 0
    assert "every training run passes" in capsys.readouterr().out


def test_a_fetch_without_gguf_is_one_line_naming_pip_install_gguf(tmp_path, monkeypatch):
    from easy_context.models import fetch

    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    with pytest.raises(SystemExit) as info:
        fetch.fetch("smollm2-135m", dest=str(tmp_path / "m"))
    message = str(info.value.code)
    assert message.startswith("error: ") and "\n" not in message and "pip install gguf" in message
    (tmp_path / "r.yaml").write_text("seq-length: 65536\nrope-theta: 5.0e+8\npipeline:\n  fetch: smollm2-135m\n"
                                     f"  model: {tmp_path / 'm'}\n  base_length: 8192\n")  # fmt: skip
    with pytest.raises(SettingsError, match="fetching smollm2-135m needs the gguf package: pip install gguf"):
        preflight(resolve(str(tmp_path / "r.yaml"), {}))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_derived_recipe_carries_its_cpu_miniature(family, capsys, tmp_path):
    values = dict(model_type="llama", num_attention_heads=6, num_key_value_heads=2, **TINY) if family == "llama" else \
        dict(GEMMA3)  # fmt: skip
    native = values["max_position_embeddings"]
    target = native * (16 if family == "llama" else 8)  # lengths with a tabled RoPE bound
    d = derive(dict(values), target, gpus=2, gpu_mem="80GB", name=family)
    micro = d.recipe.settings["micro"]
    model, config = micro["micro_model"], model_config(dict(values))
    tiny = micro_config(model)
    assert model["model_type"] == config.model_type and micro["device"] == "cpu" and micro["nproc"] == 2
    heads = (config.num_attention_heads, config.num_key_value_heads)
    assert tiny.num_attention_heads / tiny.num_key_value_heads == heads[0] / heads[1]  # the same GQA ratio
    assert tiny.hidden_size % tiny.num_attention_heads == 0 and tiny.num_hidden_layers <= 6
    if family == "gemma3":  # one period of the layer pattern, the window scaled to the miniature's lengths
        assert tiny.layer_types == config.layer_types[:6] == layer_period(config.layer_types)
        assert tiny.layer_types.count("full_attention") == 1 and tiny.sliding_window < BASE
    stages = [s["seq-length"] for s in micro["stages"]] + [micro["target"]]
    assert len(stages) == len(d.recipe.all_stages) and stages == [512 * 2**i for i in range(len(stages))]
    path = d.recipe.write(tmp_path / "r.yaml")
    assert cli.main(["--recipe", str(path), "--dry-run", "--micro"]) == 0
    out = capsys.readouterr().out
    assert f"main: {micro['target']} tokens x 3 steps" in out and "its CPU miniature (MICRO=1)" in out
    assert f"{d.recipe.target}" not in out.replace(f"{micro['target']}", "")  # none of the full-size lengths
    assert "every training run passes train.py's layout check" in out
    assert cli.main(["--model", json_folder(tmp_path, values), "--to", str(target), "--gpus", "2", "--micro",
                     "--dry-run"]) == 0  # derived and shown as its miniature, nothing written  # fmt: skip
    assert f"main: {micro['target']} tokens" in capsys.readouterr().out and not (tmp_path / "out").exists()


def json_folder(tmp_path, values: dict) -> str:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values))
    return str(folder)


def test_a_launched_rank_other_than_0_refuses_quietly(monkeypatch, capsys):
    monkeypatch.setattr(common_cli, "QUIET_EXIT_DELAY_S", 0.0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as info:
        common_cli.refuse("error: the same on every rank")
    assert info.value.code == 1 and capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit, match="error: the same on every rank"):
        common_cli.refuse("error: the same on every rank")
