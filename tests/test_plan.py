"""easy_context.plan: the memory planner's arithmetic and its CLI (no GPU, no downloads)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from easy_context.plan import (
    GB,
    MODES,
    OPTIONS,
    ModelShape,
    Setup,
    build_budget,
    load_model_shape,
    parse_config,
    parse_size,
    plan,
    predict,
)

CONFIGS = ["full", "offload", "offload+tiled", "offload+chunked", "offload+tiled+chunked", "full+tiled+chunked"]


def _setup(gpus=8, **kw):
    return Setup(gpus=gpus, gpu_mem=parse_size("80GB"), host_mem=parse_size("1TB"), **kw)


def test_parse_size():
    assert parse_size("80GB") == 80e9
    assert parse_size("141GB") == 141e9
    assert parse_size("1TB") == 1e12
    assert parse_size("512GiB") == 512 * 2**30
    assert parse_size("2048MiB") == 2**31
    with pytest.raises(ValueError):
        parse_size("lots")


def test_builtin_shapes_and_params():
    l3 = load_model_shape("meta-llama/Meta-Llama-3-8B")
    assert (l3.hidden, l3.layers, l3.heads, l3.kv_heads, l3.head_dim, l3.vocab) == (4096, 32, 32, 8, 128, 128256)
    assert abs(l3.params - 8.03e9) < 0.01e9  # the published 8.03B
    assert abs(load_model_shape("meta-llama/Llama-2-7b-hf").params - 6.74e9) < 0.01e9
    assert abs(load_model_shape("llama-3-70b").params - 70.55e9) < 0.1e9
    assert abs(load_model_shape("Qwen/Qwen2-7B").params - 7.62e9) < 0.01e9


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", CONFIGS)
def test_breakdown_sums_to_total(mode, config):
    shape = load_model_shape("llama-3-8b")
    budget = build_budget(shape, _setup(), mode, parse_config(config))
    r = budget.at(1 << 20)
    assert sum(b for _, b in r["gpu"]) == pytest.approx(r["gpu_total"])
    assert r["gpu_total"] == pytest.approx(max(r["phase_totals"].values()))
    assert r["gpu_total"] == pytest.approx(r["phase_totals"][r["peak_phase"]])
    assert sum(b for _, b in r["host"]) == pytest.approx(r["host_total"])


@pytest.mark.parametrize("mode", MODES)
def test_activations_linear_in_s_and_inverse_in_w(mode):
    shape = load_model_shape("llama-3-8b")
    cfg = parse_config("offload+tiled+chunked")

    def activations(seq, gpus):  # GPU peak minus the seq-independent part
        b = build_budget(shape, _setup(gpus), mode, cfg)
        return b.at(seq)["phase_totals"]["attn bwd"] - b.at(0)["phase_totals"]["attn bwd"]

    s = 1 << 20
    assert activations(2 * s, 4) == pytest.approx(2 * activations(s, 4))
    assert activations(3 * s, 4) == pytest.approx(3 * activations(s, 4))
    if mode == "data_parallel":  # every rank holds the whole sequence
        assert activations(s, 8) == pytest.approx(activations(s, 4))
    elif mode in ("zigzag_ring_attn", "dist_flash_attn"):  # same per-token buffers, s = S / W
        assert activations(s, 8) == pytest.approx(activations(s, 4) / 2)
    else:  # Ulysses: K/V replication may differ with W; never more per rank with more ranks
        assert activations(s, 8) <= activations(s, 4) / 2 * 1.25


def test_solve_is_tight():
    shape = load_model_shape("llama-3-8b")
    setup = _setup(8, sp_size=8)
    cfg = parse_config("offload+tiled+chunked")
    p = predict(shape, setup, "zigzag_ring_attn", cfg)
    assert p.max_seq > 0 and p.max_seq % 1024 == 0 and p.max_seq % 16 == 0
    b = build_budget(shape, setup, "zigzag_ring_attn", cfg)
    assert b.at(p.max_seq)["gpu_total"] <= setup.gpu_mem
    assert b.at(p.max_seq)["host_total"] <= setup.host_mem
    over = b.at(p.max_seq + 1024 * 16)
    assert over["gpu_total"] > setup.gpu_mem or over["host_total"] > setup.host_mem


def test_ulysses_infeasible_when_heads_do_not_divide():
    qwen = load_model_shape("qwen2-7b")  # 28 heads, 4 kv heads
    preds = {p.mode: p for p in plan(qwen, _setup(8), options=OPTIONS[:1])}
    assert preds["ulysses_attn"].limited_by == "infeasible" and "28" in preds["ulysses_attn"].reason
    assert preds["usp_attn"].max_seq > 0 and preds["usp_attn"].ring_degree == 2  # Ulysses degree 4 divides 28
    assert preds["zigzag_ring_attn"].max_seq > 0
    odd = ModelShape("odd", 1024, 4, heads=6, kv_heads=6, head_dim=128, intermediate=2816, vocab=32000)
    preds = {p.mode: p for p in plan(odd, _setup(8), options=OPTIONS[:1])}
    assert preds["ulysses_attn"].limited_by == "infeasible"
    assert preds["usp_attn"].ring_degree == 4  # Ulysses degree 2 divides 6 heads


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3-8b", "qwen2-7b", "tiny-llama"])
@pytest.mark.parametrize("gpus,gpu_mem,host_mem", [(1, "80GB", "1TB"), (8, "80GB", "1TB"), (8, "141GB", "256GB")])
def test_tiled_mlp_and_chunked_loss_never_decrease_the_prediction(model, gpus, gpu_mem, host_mem):
    shape = load_model_shape(model)
    setup = Setup(gpus=gpus, gpu_mem=parse_size(gpu_mem), host_mem=parse_size(host_mem))
    for mode in MODES:
        seqs = [p.max_seq for p in plan(shape, setup, [mode])]
        assert seqs == sorted(seqs), (mode, seqs)


def test_tiled_mlp_and_chunked_loss_reduce_gpu_bytes_at_long_context():
    shape = load_model_shape("llama-3-8b")
    for mode in MODES:
        at = {c: build_budget(shape, _setup(), mode, parse_config(c)).at(1 << 21)["gpu_total"] for c in CONFIGS}
        assert at["offload+tiled"] <= at["offload"]
        assert at["offload+chunked"] < at["offload"]
        assert at["offload+tiled+chunked"] < at["offload+tiled"]


def test_optimizer_placement():
    shape = load_model_shape("llama-2-7b")
    cfg = parse_config("offload+tiled+chunked")
    host = {o: build_budget(shape, _setup(8, optim=o), "zigzag_ring_attn", cfg).at(0)["host_total"] for o in
            ("zero3_offload", "zero3", "ddp")}  # fmt: skip
    assert host["zero3_offload"] - host["zero3"] == pytest.approx(18 * shape.params)
    assert predict(shape, _setup(8, optim="ddp"), "zigzag_ring_attn", cfg).limited_by == "infeasible"  # 16P > 80 GB


def _run(*args):
    out = subprocess.run(
        [sys.executable, "-m", "easy_context.plan", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_cli_preset_and_config_json(tmp_path):
    text = _run("--model", "tiny-llama", "--gpus", "2", "--gpu-mem", "24GB", "--host-mem", "64GB")
    assert "Byte budget per GPU" in text and "TOTAL (peak)" in text
    assert "max S (tokens)" in text and all(m in text for m in MODES)
    cfg = dict(model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
               num_key_value_heads=4, intermediate_size=5632, vocab_size=32000, tie_word_embeddings=True)  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    text = _run("--model", str(path), "--gpus", "4", "--gpu-mem", "80GB", "--host-mem", "512GiB",
                "--sp", "zigzag_ring_attn", "ulysses_attn", "--show", "ulysses_attn:offload+tiled")  # fmt: skip
    assert "Byte budget per GPU" in text and "ulysses_attn, offload+tiled" in text and "max S (tokens)" in text
    data = json.loads(_run("--model", str(tmp_path), "--gpus", "4", "--json", "--anchors"))
    assert data["model"]["tied"] and data["model"]["hidden"] == 2048
    assert {p["mode"] for p in data["predictions"]} == {*MODES}
    assert len(data["predictions"]) == len(MODES) * len(OPTIONS)
    bd = data["breakdown"]
    assert sum(bd["gpu"].values()) == pytest.approx(bd["gpu_total"])
    assert bd["gpu_total"] <= 80 * GB
    assert all(a["predicted"] > 0 for a in data["anchors"])
