"""The extension summary of a time-limited run (train_scripts/demo_h200.sh): a stage without results is null with
--partial (and still an error without it), training speed from train.py's metrics.jsonl, and a heatmap of many
lengths labels at most 16 of them."""

from __future__ import annotations

import csv
import json

import pytest


def _needle(folder, lengths, hit):
    rows = [{"length": n, "depth": d, "sample": 0, "correct": int(hit(n)), "answer_logprob": -1.0}
            for n in lengths for d in (0, 50, 100)]  # fmt: skip
    (folder / "needle").mkdir(parents=True)
    with open(folder / "needle" / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (folder / "ppl.csv").write_text("model,tokens,ppl,loss\nm,512,30.0,0\nm,1024,25.0,0\nm,4096,900.0,0\n")


def test_partial_summary_and_training_speed(tmp_path):
    from easy_context.eval.extension import main

    _needle(tmp_path / "before", range(896, 4000, 1024), lambda n: n <= 2048)
    run = tmp_path / "extended"
    run.mkdir()
    rows = [  # two logged intervals of a resumed run: the first one slow (warm-up)
        {"step": 50, "loss": 3.0, "tokens": 100_000, "tokens_per_s": 1_000.0, "peak_mem_bytes": 2 * 2**30},
        {"step": 100, "loss": 2.5, "tokens": 200_000, "tokens_per_s": 4_000.0, "peak_mem_bytes": 3 * 2**30},
        {"step": 150, "loss": 2.0, "tokens": 300_000, "tokens_per_s": 5_000.0, "peak_mem_bytes": 3 * 2**30},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--before", str(tmp_path / "before"), "--after", str(tmp_path / "after"), "--base-length", "2048",
            "--target-length", "4096", "--output", str(tmp_path / "out")]  # fmt: skip
    assert main(args) == 2  # the "after" folder does not exist: an error, unless --partial
    assert main([*args, "--partial", "--train-metrics", f"extension={run}"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["after"] is None and summary["before"]["needle_within"] == 1.0
    assert summary["before"]["needle_beyond"] == 0.0 and summary["before"]["ppl"]["4096"] == 900.0
    speed = summary["training"]["extension"]
    assert speed["steps"] == 150 and speed["tokens"] == 300_000 and speed["tokens_per_s"] == 4_000.0
    assert speed["train_seconds"] == pytest.approx(100 + 25 + 20, abs=0.1) and speed["peak_mem_gib"] == 3.0
    assert speed["loss"] == 2.0 and "mfu" not in speed
    assert (tmp_path / "out" / "extension.png").stat().st_size > 10_000


def test_bad_train_metrics_flag_is_a_usage_error(tmp_path):
    from easy_context.eval.extension import main

    with pytest.raises(SystemExit) as exc:
        main(["--before", "b", "--after", "a", "--base-length", "1", "--target-length", "2", "--output", "o",
              "--train-metrics", "no-equals-sign"])  # fmt: skip
    assert exc.value.code == 2


def test_heatmap_of_many_lengths_labels_at_most_16(tmp_path):
    import matplotlib.pyplot as plt

    from easy_context.eval import plots

    rows = [{"length": n, "depth": d, "correct": 1} for n in range(896, 31617, 1024) for d in (0, 50, 100)]
    fig, ax = plt.subplots()
    plots._heatmap(fig, ax, rows, mark_length=2048)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    plt.close(fig)
    assert labels[:2] == ["896", "2944"] and len(labels) == 16 and not ax.texts  # every 2nd, no annotations
