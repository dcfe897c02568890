"""easy_context.plan: the memory planner's arithmetic and its CLI (no GPU, no downloads)."""

from __future__ import annotations

import json
import subprocess

import pytest

from easy_context.plan import (
    GB,
    GIB,
    MODES,
    OPTIONS,
    ModelShape,
    Setup,
    budget_at,
    build_budget,
    format_validation,
    load_model_shape,
    main,
    parse_config,
    parse_size,
    plan,
    predict,
    read_probes,
    split_offload_layers,
    validate_probe,
)
from tests.support import zygote

CONFIGS = ["full", "offload", "offload+tiled", "offload+chunked", "offload+tiled+chunked", "full+tiled+chunked",
           "offload-split+tiled+chunked"]  # fmt: skip


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
        [zygote.python(), "-m", "easy_context.plan", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _main(capsys, *args):  # the CLI in this process (one subprocess run above checks the -m entry point)
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_cli_preset_and_config_json(tmp_path, capsys):
    text = _run("--model", "llama-2-7b", "--gpus", "2", "--gpu-mem", "80GB", "--host-mem", "512GB")
    assert "Byte budget per GPU" in text and "TOTAL (peak)" in text
    assert "max S (tokens)" in text and all(m in text for m in MODES)
    text = _main(capsys, "--model", "tiny-llama", "--gpus", "2", "--gpu-mem", "24GB", "--host-mem", "64GB")
    assert "Byte budget per GPU" in text and "TOTAL (peak)" in text
    assert "max S (tokens)" in text and all(m in text for m in MODES)
    cfg = dict(model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
               num_key_value_heads=4, intermediate_size=5632, vocab_size=32000, tie_word_embeddings=True)  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    text = _main(capsys, "--model", str(path), "--gpus", "4", "--gpu-mem", "80GB", "--host-mem", "512GiB",
                 "--sp", "zigzag_ring_attn", "ulysses_attn", "--show", "ulysses_attn:offload+tiled")  # fmt: skip
    assert "Byte budget per GPU" in text and "ulysses_attn, offload+tiled" in text and "max S (tokens)" in text
    data = json.loads(_main(capsys, "--model", str(tmp_path), "--gpus", "4", "--json", "--anchors"))
    assert data["model"]["tied"] and data["model"]["hidden"] == 2048
    assert {p["mode"] for p in data["predictions"]} == {*MODES}
    assert len(data["predictions"]) == len(MODES) * len(OPTIONS)
    bd = data["breakdown"]
    assert sum(bd["gpu"].values()) == pytest.approx(bd["gpu_total"])
    assert bd["gpu_total"] <= 80 * GB
    assert all(a["predicted"] > 0 for a in data["anchors"])
    assert all(a["predicted_chunked"] >= a["predicted"] for a in data["anchors"])
    assert data["setup"]["norm"] == "eager"


# ------------------------------------------------------------------------ host_adamw, offload-split, validation
# bench/max_context.py on one H200 (139.8 GiB, torch 2.11, 2026-11-29; results/h200/h200_max_context.jsonl):
# data_parallel, cuDNN attention, HostAdamW, the first k layer inputs offloaded to pageable host memory, 8192-token
# MLP tiles, chunked loss. The 8B runs allocated the optimizer's host state lazily, at the step (their host peak
# is the optimizer step); the 7B run allocated it before the step (steady state: optimizer + checkpoints).
H200_PROBES = [
    dict(name="max_context_probe", model="shape:llama-3-8b", seq=65536, optimizer="host_adamw", params=8030261248,
         offload_layers=32, peak_gpu_gib=38.71, peak_gpu_reserved_gib=41.51, peak_host_rss_gib=95.81,
         gpu_total_gib=139.8, status="ok", optimizer_state="lazy"),
    dict(name="max_context_probe", model="shape:llama-3-8b", seq=131072, optimizer="host_adamw", params=8030261248,
         offload_layers=26, peak_gpu_gib=48.5, peak_gpu_reserved_gib=53.76, peak_host_rss_gib=95.85,
         gpu_total_gib=139.8, status="ok", optimizer_state="lazy"),
    dict(name="max_context_probe", model="shape:llama-3-8b", seq=262144, optimizer="host_adamw", params=8030261248,
         offload_layers=12, peak_gpu_gib=95.49, peak_gpu_reserved_gib=98.8, peak_host_rss_gib=95.82,
         gpu_total_gib=139.8, status="ok", optimizer_state="lazy"),
    dict(name="max_context_probe", model="shape:llama-2-7b", seq=262144, optimizer="host_adamw", params=6738415616,
         offload_layers=20, peak_gpu_gib=79.27, peak_gpu_reserved_gib=80.63, peak_host_rss_gib=116.92,
         gpu_total_gib=139.8, status="ok", optimizer_state="before_step"),
]  # fmt: skip
# The same stack with --chunked-rmsnorm (optimizer state allocated before the step: steady state), 2026-11-29.
H200_CHUNKED_PROBE = dict(
    name="max_context_probe", model="shape:llama-3-8b", seq=417792, optimizer="host_adamw", params=8030261248,
    offload_layers=8, peak_gpu_gib=128.23, peak_gpu_reserved_gib=130.55, peak_host_rss_gib=116.96,
    gpu_total_gib=139.8, status="ok", optimizer_state="before_step",
    command="python bench/max_context.py --model shape:llama-3-8b --kernel cudnn --chunked-rmsnorm --seq 417792",
)  # fmt: skip
SPLIT = parse_config("offload-split+tiled+chunked")


def _h200(model, host="125GiB", **kw):
    kw = dict(gpus=1, gpu_mem=139.8 * GIB, host_mem=parse_size(host), optim="host_adamw", mlp_tile_tokens=8192) | kw
    return load_model_shape(model), Setup(**kw)


def test_validate_h200_max_context_probes():
    checks = [validate_probe(row) for row in H200_PROBES]
    print()
    print(format_validation(checks))
    for row, c in zip(H200_PROBES, checks):
        assert c["norm"] == "eager"  # the probes ran transformers' eager RMSNorm (no --chunked-rmsnorm)
        assert c["params"] == row["params"]  # the planner's parameter count is the model's
        # GPU: what the allocator holds at the peak (the planner adds 10 % fragmentation to the tensors it counts)
        assert abs(c["err_gpu_reserved"]) < 0.10, c
        assert abs(c["err_gpu_allocated"]) < 0.02, c  # the live tensors themselves: counted term by term
        assert c["gpu_phase"].startswith("norm bwd")  # eager RMSNorm backward: the peak of a tiled layer
        # host: the steady state when the optimizer state exists before the step, else the optimizer step
        err = c["err_host"] if row["optimizer_state"] == "before_step" else c["err_host_lazy"]
        assert abs(err) < 0.10, c
    # where the peak sits: the bottom of the backward (all gradients) while the host holds every checkpoint, the
    # top (all GPU-resident checkpoints) once many stay on the GPU
    assert [c["gpu_phase"] for c in checks[:3]] == ["norm bwd @ layer 0", "norm bwd @ layer 0", "norm bwd"]


def test_validate_h200_chunked_norm_probe_near_the_predicted_limit():
    """The --chunked-rmsnorm probe: its peak is the attention backward (with GQA, the kernel's dK/dV per query
    head count there), and its length is within 1 % of the longest context the planner predicts for it."""
    c = validate_probe(H200_CHUNKED_PROBE)
    print()
    print(format_validation([c]))
    assert c["norm"] == "chunked" and c["gpu_phase"] == "attn bwd"
    assert abs(c["err_gpu_allocated"]) < 0.02 and abs(c["err_gpu_reserved"]) < 0.10 and abs(c["err_host"]) < 0.10, c
    shape, setup = _h200("llama-3-8b", norm="chunked")
    longest = predict(shape, setup, "data_parallel", SPLIT).max_seq
    assert 0.99 * longest <= H200_CHUNKED_PROBE["seq"] <= longest, longest  # the measured length is near the limit


def test_shape_prefix_names_the_builtin_model():
    assert load_model_shape("shape:llama-3-8b") == load_model_shape("llama-3-8b")


@pytest.mark.parametrize("mode", ["data_parallel", "ulysses_attn", "zigzag_ring_attn"])
def test_gqa_kernel_backward_holds_dk_dv_per_query_head(mode):
    """cuDNN's and FA2's backward build dK and dV at the query heads before the GQA group sum: 2Q per token."""
    gpus = 1 if mode == "data_parallel" else 2
    gqa, mha = load_model_shape("llama-3-8b"), load_model_shape("llama-2-7b")
    setup = _setup(gpus=gpus)
    for shape, expect in ((gqa, True), (mha, False)):
        terms = build_budget(shape, setup, mode, SPLIT).phases["attn bwd"]
        extra = [t for t in terms if "GQA" in t.name]
        assert bool(extra) == expect, (shape.name, mode)
        if expect:
            assert extra[0].per_token == pytest.approx(2 * 2 * shape.qd)  # dK + dV, bf16, q_dim wide


def test_validate_cli_reads_jsonl(tmp_path, capsys):
    path = tmp_path / "max_context.jsonl"
    rows = H200_PROBES + [dict(name="max_context", longest_ok=None), dict(H200_PROBES[0], status="oom")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(read_probes(str(path))) == len(H200_PROBES)
    text = _main(capsys, "--validate", str(path))
    assert "norm bwd" in text and "llama-2-7b" in text and text.count("262,144") == 2
    assert "eager" in text and "chunked" not in text  # the probes' own norm
    assert text == _main(capsys, "--validate", str(path), "--norm", "eager")
    assert "chunked" in _main(capsys, "--validate", str(path), "--norm", "chunked")
    data = json.loads(_main(capsys, "--validate", str(path), "--json"))
    assert [d["seq"] for d in data] == [r["seq"] for r in H200_PROBES]


def test_bench_offload_layers_policy_matches_the_probes():
    """With the bench's 8 GB host reserve and the host's ~125 GiB, the planner's k is what the probes offloaded, within
    one layer (the bench reads MemAvailable, ~125 GiB, and leaves out the optimizer's 2 GB of staging buffers)."""
    for row in [*H200_PROBES, H200_CHUNKED_PROBE]:
        shape, setup = _h200(row["model"].removeprefix("shape:"), host_reserve=8 * GB)
        k = split_offload_layers(shape, setup, "data_parallel", SPLIT, row["seq"])
        assert abs(k - row["offload_layers"]) <= 1, (row["seq"], k)


@pytest.mark.parametrize("model", ["llama-3-8b", "llama-2-7b"])
def test_host_adamw_split_longest_context_on_h200(model):
    shape, setup = _h200(model)
    p = predict(shape, setup, "data_parallel", SPLIT)
    print(
        f"\n{model}: max S {p.max_seq:,} ({p.limited_by}, {p.offload_layers} of {shape.layers} layer inputs offloaded)"
    )
    assert p.max_seq > 262144  # 262144 ran with headroom (80.6 / 98.8 GiB of 139.8 reserved)
    assert p.limited_by.startswith("gpu:norm bwd") and 0 < p.offload_layers < shape.layers  # host full, GPU bound
    b = budget_at(shape, setup, "data_parallel", SPLIT, p.max_seq)
    assert b.offload_layers == p.offload_layers
    r = b.at(p.max_seq)
    assert r["gpu_total"] <= setup.gpu_mem and r["host_total"] <= setup.host_mem
    nxt = p.max_seq + 1024
    assert budget_at(shape, setup, "data_parallel", SPLIT, nxt).at(nxt)["gpu_total"] > setup.gpu_mem  # tight
    # more than the same stack with every checkpoint on the host (pinned) or on the GPU
    assert p.max_seq > predict(shape, setup, "data_parallel", parse_config("offload+tiled+chunked")).max_seq
    assert p.max_seq > predict(shape, setup, "data_parallel", parse_config("full+tiled+chunked")).max_seq


def test_offload_split_limits_and_coupling():
    shape, setup = _h200("llama-3-8b", pinned_pow2=False)
    L, A = shape.layers, 2 * shape.hidden
    full, off = parse_config("full+tiled+chunked"), parse_config("offload+tiled+chunked")
    seq = 1 << 18
    # k = L is the (pageable) offload of every layer input, k = 0 keeps them all on the GPU like ``full``
    for k, same in ((L, off), (0, full)):
        a, b = (
            build_budget(shape, setup, "data_parallel", SPLIT, k).at(seq),
            build_budget(shape, setup, "data_parallel", same).at(seq),
        )
        assert a["gpu_total"] == pytest.approx(b["gpu_total"]) and a["host_total"] == pytest.approx(b["host_total"])
    # a host without room for a checkpoint keeps them all on the GPU; a huge one takes them all
    assert split_offload_layers(shape, _h200("llama-3-8b", host="102GB")[1], "data_parallel", SPLIT, seq) == 0
    assert split_offload_layers(shape, _h200("llama-3-8b", host="10TB")[1], "data_parallel", SPLIT, seq) == L
    assert predict(shape, _h200("llama-3-8b", host="10TB")[1], "data_parallel", SPLIT).offload_layers == L

    # once the host is full each further token costs every GPU-resident layer input: the GPU slope grows with S
    def gpu(n):
        return budget_at(shape, setup, "data_parallel", SPLIT, n).at(n)["gpu_total"]

    ks = [split_offload_layers(shape, setup, "data_parallel", SPLIT, n) for n in (1 << 16, 1 << 17, 1 << 18)]
    assert ks[0] == L and ks[0] > ks[1] > ks[2]
    step = 1 << 16
    slopes = [(gpu(n + step) - gpu(n)) / step for n in (1 << 16, 1 << 17, 1 << 18)]
    assert slopes[0] < slopes[1] < slopes[2]
    assert slopes[2] > (1 + setup.frag) * (L - ks[2]) * A  # at least the resident inputs' bytes per token


def test_host_adamw_states():
    shape, setup = _h200("llama-3-8b", host="1TB", pinned_pow2=False)
    P, V, h = shape.params, shape.vocab, shape.hidden
    b = build_budget(shape, setup, "data_parallel", SPLIT, offload_layers=10)
    r = b.at(0)
    # host: 12 B/param + two bf16 staging buffers of the largest tensor (+ its fp32 upcast at the step)
    assert r["host_phase_totals"]["forward/backward"] == pytest.approx(setup.host_reserve + 12 * P + 4 * V * h)
    assert r["host_phase_totals"]["optimizer step"] == pytest.approx(setup.host_reserve + 12 * P + 8 * V * h)
    seq = 1 << 18
    assert b.at(seq)["host_phase_totals"]["forward/backward"] == pytest.approx(
        r["host_phase_totals"]["forward/backward"] + 10 * 2 * h * seq)  # fmt: skip
    # GPU: bf16 params and, at the step, all bf16 grads; nothing else of the optimizer
    step = sum(t.at(0) for t in b.gpu_persistent) + sum(t.at(0) for t in b.phases["optimizer step"])
    assert step == pytest.approx(4 * P)
    # the gradients grow through the backward: all but the input embedding's at layer 0
    grads = {p: sum(t.fixed for t in b.phases[p] if "grads" in t.name) for p in ("norm bwd", "norm bwd @ layer 0")}
    assert grads["norm bwd"] == pytest.approx(2 * (V * h + h + shape.layer_params))
    assert grads["norm bwd @ layer 0"] == pytest.approx(2 * (P - V * h))
    assert predict(shape, Setup(gpus=1, gpu_mem=139.8 * GIB, host_mem=parse_size("64GiB"), optim="host_adamw"),
                   "data_parallel", SPLIT).limited_by == "infeasible"  # 12P does not fit a 64 GiB host  # fmt: skip


def test_mlp_tile_tokens():
    shape = load_model_shape("llama-3-8b")
    h, i = shape.hidden, shape.intermediate
    cfg = parse_config("offload+tiled+chunked")
    tiles = {t: build_budget(shape, _setup(mlp_tile_tokens=t), "zigzag_ring_attn", cfg).at(0)["phase_totals"]
             for t in (4096, 8192)}  # fmt: skip
    assert (tiles[8192]["mlp bwd"] - tiles[4096]["mlp bwd"]) / 1.1 == pytest.approx(6 * 2 * i * 4096)
    auto = build_budget(shape, _setup(), "zigzag_ring_attn", cfg).at(0)["phase_totals"]["mlp bwd"]
    assert auto == pytest.approx(tiles[h]["mlp bwd"] if h in tiles else tiles[4096]["mlp bwd"])  # auto = h tokens
    with pytest.raises(ValueError):
        _setup(mlp_tiles=8, mlp_tile_tokens=8192)


ROWS = [("ulysses_attn", "offload-split+tiled+chunked"), ("usp_attn", "full"), ("zigzag_ring_attn", "offload+tiled"),
        ("data_parallel", "offload")]  # fmt: skip


@pytest.mark.parametrize("sp, config", ROWS)
def test_planner_row_as_train_flags(sp, config, capsys):
    """A planner row's configuration printed as train.py flags: train.py parses them and they select that row."""
    from easy_context.plan import main as plan_main
    from easy_context.plan import parse_config
    from train import parse_args

    gpus = 1 if sp == "data_parallel" else 8
    assert plan_main(["--model", "llama-3-8b", "--gpus", str(gpus), "--sp", sp, "--show", f"{sp}:{config}"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "as a run" in x)
    args = parse_args(["--model", "m", "--dataset", "d", "--output-dir", "o", *line.split("train.py ", 1)[1].split()])
    option = parse_config(config)
    assert args.parallel_mode == sp
    assert args.checkpointing == ("full" if option.checkpointing == "full" else "offload")
    assert (args.offload_layers is not None) == (option.checkpointing == "offload-split")
    assert (args.tiled_mlp > 0) == option.tiled_mlp
    assert args.loss == ("chunked" if option.chunked_loss else "plain")
    assert (args.ring_degree is not None) == (sp == "usp_attn")


def test_planner_unknown_model_is_one_line(capsys):
    from easy_context.plan import main as plan_main

    with pytest.raises(SystemExit) as exc:
        plan_main(["--model", "no-such-model"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown model 'no-such-model'" in err and "Traceback" not in err
