"""Long-context evals end to end on CPU: needle CSV/PNG, SP == 1 process, needle depth, perplexity, plots, errors."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.jobs import run_job

ROOT = Path(__file__).resolve().parents[2]
WORDS = ("the model reads a long context and learns where each word comes from in the text while every "
         "sentence ends").split()  # fmt: skip
ENV = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def synthetic_text(seed: int, sentences: int) -> str:
    """Structured sentences of 4-18 words (learnable, with sentence boundaries for the needle)."""
    rng = random.Random(seed)
    out = []
    for i in range(sentences):
        n = rng.randint(4, 18)
        words = [WORDS[(j * 5 + i) % len(WORDS)] if rng.random() < 0.85 else rng.choice(WORDS) for j in range(n)]
        out.append(" ".join(words).capitalize() + rng.choice(".!?."))
    return " ".join(out) + "\n"


def run(script: str, *args: str, procs: int = 1, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, script, *args]
    if procs > 1:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
               "--num_processes", str(procs), script, *args]  # fmt: skip
    res = run_job(cmd, cwd=ROOT, env=ENV, timeout=600)
    if check:
        assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """Synthetic train/held-out text, a BPE tokenizer, a tiny random Llama checkpoint and a briefly trained one."""
    root = tmp_path_factory.mktemp("eval")
    (root / "train").mkdir()
    for i in range(10):
        (root / "train" / f"doc{i}.txt").write_text(synthetic_text(i, 400))
    (root / "heldout").mkdir()
    for i in range(3):
        (root / "heldout" / f"doc{i}.txt").write_text(synthetic_text(100 + i, 60))
    (root / "haystack").mkdir()  # short on purpose: the needle eval must repeat it
    (root / "haystack" / "essay.txt").write_text(synthetic_text(7, 5))
    prepared = root / "prepared"
    subprocess.run([zygote.python(), "-m", "easy_context.data", "--dataset", str(root / "train"), "--output",
                    str(prepared), "--seq-length", "256", "--train-tokenizer", "300"],
                   check=True, capture_output=True, cwd=ROOT)  # fmt: skip
    from transformers import AutoTokenizer

    from tests.support.models import tiny_model

    tokenizer = AutoTokenizer.from_pretrained(prepared / "tokenizer")
    model = tiny_model("llama", vocab_size=len(tokenizer), max_position_embeddings=200)
    model.save_pretrained(root / "tiny")
    tokenizer.save_pretrained(root / "tiny")
    run("train.py", "--model", "tiny-llama", "--tokenizer", str(prepared / "tokenizer"), "--dataset", str(prepared),
        "--output-dir", str(root / "trained"), "--seq-length", "256", "--batch-size", "2",
        "--gradient-accumulate-every", "1", "--max-train-steps", "20", "--learning-rate", "3e-3", "--warmup-steps", "2",
        "--dtype", "float32", "--checkpointing", "none", "--parallel_mode", "data_parallel", "--seed", "0")  # fmt: skip
    return {"root": root, "tokenizer": prepared / "tokenizer", "tiny": root / "tiny", "trained": root / "trained"}


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_needle_grid_outputs_and_sp_equals_one_process(setup, tmp_path):
    args = ["--model", str(setup["tiny"]), "--haystack_dir", str(setup["root"] / "haystack"),
            "--min_context_length", "90", "--max_context_length", "270", "--context_interval", "90",
            "--depth_interval", "0.5", "--num_samples", "2", "--num_distractor", "1", "--rnd_number_digits", "5",
            "--generate"]  # fmt: skip
    one = run("eval_needle.py", *args, "--output-dir", str(tmp_path / "one"))
    two = run("eval_needle.py", *args, "--output-dir", str(tmp_path / "two"), "--parallel_mode", "zigzag_ring_attn",
              procs=2)  # fmt: skip
    rows = read_rows(tmp_path / "one" / "results.csv")
    cells = {(int(r["length"]), float(r["depth"]), int(r["sample"])) for r in rows}
    assert len(rows) == len(cells) == 3 * 3 * 2
    assert cells == {(n, d, s) for n in (90, 180, 270) for d in (0.0, 50.0, 100.0) for s in (0, 1)}
    assert {"correct", "predicted", "answer", "generated", "generated_correct"} <= set(rows[0])
    summary = json.loads((tmp_path / "one" / "results.json").read_text())
    assert len(summary["rows"]) == 18 and len(summary["cells"]) == 9
    assert_png(tmp_path / "one" / "heatmap.png")
    sp_rows = read_rows(tmp_path / "two" / "results.csv")
    assert summary["parallel_mode"] == "data_parallel"
    for a, b in zip(rows, sp_rows, strict=True):  # prompts are odd lengths: zigzag on 2 ranks pads them
        for key in ("length", "depth", "sample", "correct", "predicted", "generated", "generated_correct"):
            assert a[key] == b[key], (key, a, b)
        assert float(a["answer_logprob"]) == pytest.approx(float(b["answer_logprob"]), rel=1e-4, abs=1e-4)
    for res in (one, two):
        assert "repeated" in res.stderr  # the haystack is shorter than 270 tokens
        assert "max_position_embeddings=200" in res.stderr and "rope_theta" in res.stderr
    # plot.py re-draws the heatmap from the CSV
    out = run("plot.py", str(tmp_path / "two" / "results.csv"), "--output", str(tmp_path / "again.png"))
    assert "again.png" in out.stdout
    assert_png(tmp_path / "again.png")


@pytest.mark.parametrize("kind", ["bpe", "bytes"])
def test_needle_sits_at_the_requested_depth(setup, tmp_path, kind):
    from transformers import AutoTokenizer

    from easy_context.data import train_byte_level_bpe
    from easy_context.eval.scoring import answer_split
    from easy_context.tasks.haystack import Haystack
    from easy_context.tasks.needle import make_case

    text = synthetic_text(3, 300)
    if kind == "bpe":
        tok = AutoTokenizer.from_pretrained(setup["tokenizer"])
    else:  # 256 bytes + 3 specials: no merges, one token per byte
        tok = train_byte_level_bpe([text], vocab_size=259, out_dir=str(tmp_path / "bytes"))
    haystack = Haystack.from_text(text, tok)
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    for depth in (0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 100.0):
        case = make_case(haystack, 600, depth, sample=1, num_distractors=0)
        start, end = case.context_span
        assert case.prompt[case.needle_char :].startswith(case.needle)
        before = case.prompt[start : case.needle_char]
        after = case.prompt[case.needle_char + len(case.needle) + 1 : end]
        got, total = count(before), count(before) + count(after)
        assert total <= 600 + 10
        # within one sentence of the requested depth: the nearest boundary is at most a sentence away
        sentence = max(haystack.token_lengths[max(case.boundary - 1, 0) : case.boundary + 1]) + 2
        assert abs(got - depth / 100 * total) <= sentence, (depth, got, total, sentence)
        ids, first = answer_split(tok, case.prompt, case.answer)
        assert tok.decode(ids[first:]) == case.answer and case.answer == f" {case.number}"


def test_ppl_sp_equals_one_process_and_training_lowers_it(setup, tmp_path):
    args = ["-m", "tiny-llama", "-m", str(setup["trained"]), "--tokenizer", str(setup["tokenizer"]),
            "--dataset", str(setup["root"] / "heldout"), "--min-tokens", "64", "--max-tokens", "256",
            "--sliding-window", "64", "--samples", "2"]  # fmt: skip
    run("eval_ppl.py", *args, "--output", str(tmp_path / "one.csv"))
    run("eval_ppl.py", *args, "--output", str(tmp_path / "two.csv"), "--parallel_mode", "zigzag_ring_attn", procs=2)
    one, two = read_rows(tmp_path / "one.csv"), read_rows(tmp_path / "two.csv")
    assert [(r["model"], int(r["tokens"])) for r in one] == [
        (m, n) for m in ("tiny-llama", str(setup["trained"])) for n in (64, 128, 256)
    ]
    assert {"model", "tokens", "ppl", "loss", "samples"} <= set(one[0])
    for a, b in zip(one, two, strict=True):
        assert float(b["ppl"]) == pytest.approx(float(a["ppl"]), rel=1e-4)
        assert a["scored_tokens"] == b["scored_tokens"]
    untrained = {int(r["tokens"]): float(r["ppl"]) for r in one if r["model"] == "tiny-llama"}
    trained = {int(r["tokens"]): float(r["ppl"]) for r in one if r["model"] != "tiny-llama"}
    assert all(trained[n] < 0.8 * untrained[n] for n in untrained), (trained, untrained)
    run("plot.py", str(tmp_path / "one.csv"), str(tmp_path / "two.csv"), "--output", str(tmp_path / "ppl.png"))
    assert_png(tmp_path / "ppl.png")


def test_windows_score_every_token_once():
    from easy_context.eval.perplexity import window_inputs, windows

    doc = list(range(1000, 1100))
    for stride, truncate in ((30, False), (200, False), (1, True)):
        scored = []
        for win in windows(len(doc), 40, stride, truncate):
            ids, targets = window_inputs(doc, win, [7])
            assert len(ids) <= 41 and ids[0] == 7
            scored += [t for t in targets if t != -100]
        assert scored == (doc[:40] if truncate else doc)


@pytest.mark.parametrize("make,message", [(None, "does not exist"), ("empty", "no .txt files")])
def test_needle_bad_haystack_dir(setup, tmp_path, make, message):
    folder = tmp_path / "haystack"
    if make:
        folder.mkdir()
    sys.path.insert(0, str(ROOT))
    import eval_needle

    with pytest.raises(SystemExit) as exc:
        eval_needle.main(["--model", str(setup["tiny"]), "--haystack_dir", str(folder)])
    assert message in str(exc.value) and "fetch.py" in str(exc.value)


def test_deepspeed_launch_precision_must_match_the_model_dtype():
    """Under DeepSpeed ZeRO-3 the launch's mixed precision decides the parameters' dtype: a mismatch is refused
    before any model is built (train.py and the evals share the check)."""
    from types import SimpleNamespace

    import pytest
    import torch

    from easy_context.eval.runtime import load_eval_model
    from easy_context.training.deepspeed_precision import deepspeed_precision_error

    def launch(mixed, deepspeed=True):
        return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=object() if deepspeed else None),
                               mixed_precision=mixed)  # fmt: skip

    assert deepspeed_precision_error(launch("bf16"), torch.bfloat16) is None
    assert deepspeed_precision_error(launch("no"), torch.float32) is None
    assert deepspeed_precision_error(launch("fp16"), torch.float16) is None
    assert deepspeed_precision_error(launch("no", deepspeed=False), torch.bfloat16) is None  # DDP: model dtype rules
    assert deepspeed_precision_error(None, torch.bfloat16) is None
    msg = deepspeed_precision_error(launch("no"), torch.bfloat16)
    assert "--mixed_precision bf16" in msg and "'no'" in msg
    assert "--mixed_precision no" in deepspeed_precision_error(launch("bf16"), torch.float32)
    runtime = SimpleNamespace(accelerator=launch("no"))
    with pytest.raises(ValueError, match="--mixed_precision bf16"):
        load_eval_model("tiny-llama", runtime, 256, torch.bfloat16)


def test_extension_summary_and_figure(tmp_path):
    """summary.json of a context extension: needle accuracy split at the base length, perplexity per length, both
    stages, from eval_needle/eval_ppl result files; the figure and the one-line summary."""
    from easy_context.eval.extension import main

    for stage, hits in (("before", {64: 1, 192: 1, 320: 0, 448: 0}), ("after", {64: 1, 192: 0, 320: 1, 448: 1})):
        rows = [{"length": n, "depth": d, "sample": 0, "correct": hit, "answer_logprob": -1.0 - 2 * (1 - hit)}
                for n, hit in hits.items() for d in (0, 50, 100)]  # fmt: skip
        rows[0]["correct"] = 0  # one miss at 64 / depth 0: within = 5/6 before
        (tmp_path / stage / "needle").mkdir(parents=True)
        with open(tmp_path / stage / "needle" / "results.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        ppl = {"before": {128: 30.0, 256: 25.0, 512: 400.0}, "after": {128: 31.0, 256: 26.0, 512: 22.0}}[stage]
        lines = ["model,tokens,ppl,loss"] + [f"m,{n},{p},0" for n, p in ppl.items()]
        (tmp_path / stage / "ppl.csv").write_text("\n".join(lines) + "\n")
    code = main(["--before", str(tmp_path / "before"), "--after", str(tmp_path / "after"), "--base-length", "256",
                 "--target-length", "512", "--seconds", "12.5", "--output", str(tmp_path / "demo")])  # fmt: skip
    assert code == 0
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["base_length"] == 256 and summary["target_length"] == 512 and summary["seconds"] == 12.5
    assert summary["before"]["needle_within"] == pytest.approx(5 / 6) and summary["before"]["needle_beyond"] == 0.0
    assert summary["after"]["needle_within"] == pytest.approx(2 / 6) and summary["after"]["needle_beyond"] == 1.0
    assert summary["before"]["ppl"] == {"128": 30.0, "256": 25.0, "512": 400.0}
    assert summary["after"]["ppl"]["512"] == 22.0
    assert summary["before"]["answer_logprob_beyond"] == -3.0 and summary["after"]["answer_logprob_beyond"] == -1.0
    assert_png(tmp_path / "demo" / "extension.png")
    assert main(["--before", str(tmp_path / "nowhere"), "--after", str(tmp_path / "after"), "--base-length", "256",
                 "--target-length", "512", "--output", str(tmp_path / "x")]) == 2  # fmt: skip


def test_csv_is_one_line_per_row_and_log_ticks_are_plain_numbers(tmp_path):
    """Predictions with line breaks stay on their row's line; a log perplexity axis labels its ticks 300, 400, ...
    (not 3x10^2)."""
    import matplotlib.pyplot as plt

    from easy_context.eval import plots
    from easy_context.eval.results import read_csv, write_csv

    rows = [{"length": 64, "predicted": "a\nb\r\nc\\d"}, {"length": 128, "predicted": "plain"}]
    write_csv(rows, str(tmp_path / "r.csv"))
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[1] == "64,a\\nb\\r\\nc\\\\d"
    assert [r["predicted"] for r in read_csv(str(tmp_path / "r.csv"))] == ["a\\nb\\r\\nc\\\\d", "plain"]
    fig, ax = plt.subplots()
    plots._ppl_axes(ax, {"m": [(128, 376.0), (256, 420.0), (512, 800.0)]}, log_y=True)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True) if t.get_text()]
    plt.close(fig)
    assert labels and all(label.replace(".", "").isdigit() for label in labels), labels


def test_position_warning_counts_rope_scaling():
    """The positions a model covers include its RoPE scaling: YaRN x2 over 64K covers 128K (no warning there),
    dynamic NTK any length; past the limit the warning names the scaling and the flags that move it."""
    from transformers import Gemma2Config, LlamaConfig

    from easy_context.eval.runtime import position_warning
    from easy_context.models import rope_position_limit as position_limit
    from easy_context.models import set_rope_scaling

    plain = LlamaConfig(max_position_embeddings=65536, rope_theta=1e7)
    assert position_limit(plain) == (65536, "max_position_embeddings=65536")
    assert position_warning(plain, 65536, "m") is None
    message = position_warning(plain, 81920, "m")
    assert "81920 tokens exceed the 65536 positions of m" in message and "--rope_scaling" in message
    yarn = LlamaConfig(max_position_embeddings=65536, rope_theta=1e7)
    set_rope_scaling(yarn, {"rope_type": "yarn", "factor": 2.0})
    assert position_limit(yarn)[0] == 131072 and position_warning(yarn, 131072, "m") is None
    assert "yarn factor 2 x 65536" in position_warning(yarn, 131073, "m")
    linear = LlamaConfig(max_position_embeddings=4096)
    set_rope_scaling(linear, {"rope_type": "linear", "factor": 4})
    assert position_limit(linear)[0] == 16384
    dynamic = LlamaConfig(max_position_embeddings=8192)
    set_rope_scaling(dynamic, {"rope_type": "dynamic", "factor": 8, "original_max_position_embeddings": 8192})
    assert position_limit(dynamic)[0] is None and position_warning(dynamic, 10**6, "m") is None
    # Llama 3.1: llama3 factor 8 over 8192 = 65536 < its max_position_embeddings 131072: the larger one holds
    llama31 = LlamaConfig(max_position_embeddings=131072, rope_theta=5e5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0})  # fmt: skip
    assert position_limit(llama31)[0] == 131072
    gemma = Gemma2Config(max_position_embeddings=8192)  # RoPE parameters per layer type
    set_rope_scaling(gemma, {"rope_type": "yarn", "factor": 4.0})
    assert position_limit(gemma)[0] == 32768
