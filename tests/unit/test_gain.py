"""The extension's headline: the gain over the best training-free baseline (easy_context.eval.gain, and the summary
easy_context.eval.compare writes from result files), against values computed by hand."""

from __future__ import annotations

import json

import pytest

from easy_context.eval import compare
from easy_context.eval.gain import gains, headline, training_free
from easy_context.eval.results import write_csv


def needle(by_length: dict[int, float]) -> dict:
    return {"by_length": by_length}


MODELS = {
    "base": {"needle": needle({256: 1.0, 1024: 0.2}), "needle_3_distractors": needle({256: 0.5, 1024: 0.0}),
             "ruler": {"scores": {"vt": {"512": 0.0, "1024": 0.0}, "fwe": {"512": 0.3}}},
             "needle_long": {"yarn:8:256": needle({2048: 0.4})}},
    "yarn": {"needle": needle({256: 0.6, 1024: 0.5}), "ruler": {"scores": {"vt": {"512": 0.25}}}},
    "control": {"needle": needle({256: 1.0, 1024: 0.9})},  # trained: never the best baseline
    "extended": {"needle": needle({256: 0.8, 1024: 1.0}), "needle_3_distractors": needle({256: 1.0, 1024: 0.75}),
                 "ruler": {"scores": {"vt": {"512": 0.5, "1024": 0.0}, "fwe": {"512": 0.2, "1024": 0.6}}},
                 "needle_long": {"as trained": needle({2048: 0.2}), "yarn:2:1024": needle({2048: 1.0})}},
}  # fmt: skip

# (task, length): (best baseline, its score, gain), worked out by hand from MODELS
EXPECTED = {
    ("needle", 256): ("base", 1.0, -0.2),
    ("needle", 1024): ("yarn", 0.5, 0.5),  # the control's 0.9 is not a baseline
    ("needle, 3 distractors", 256): ("base", 0.5, 0.5),
    ("needle, 3 distractors", 1024): ("base", 0.0, 0.75),
    ("vt", 512): ("yarn", 0.25, 0.25),
    ("vt", 1024): ("base", 0.0, 0.0),
    ("fwe", 512): ("base", 0.3, -0.1),
    ("fwe", 1024): (None, None, None),  # no baseline scored this cell
    ("needle beyond (as trained)", 2048): ("base (yarn:8:256)", 0.4, -0.2),
    ("needle beyond (yarn:2:1024)", 2048): ("base (yarn:8:256)", 0.4, 0.6),
}


def test_gain_is_the_score_minus_the_best_training_free_baseline_per_task_and_length():
    rows = gains(MODELS)
    assert training_free(MODELS) == ["base", "yarn"]
    assert {r["model"] for r in rows} == {"extended"}
    got = {(r["task"], r["length"]): (r["best_baseline"], r["best_baseline_score"], r["gain"]) for r in rows}
    assert got.keys() == EXPECTED.keys()
    for cell, (name, best, gain) in EXPECTED.items():
        assert got[cell][:2] == (name, best), cell
        assert got[cell][2] == (None if gain is None else pytest.approx(gain, abs=1e-9)), cell
    ran = {(r["task"], r["length"]): r["baselines_scored"] for r in rows}
    assert (ran[("needle", 1024)], ran[("vt", 1024)], ran[("fwe", 1024)]) == (2, 1, 0)


def test_the_first_line_says_when_no_baseline_or_only_the_base_ran():
    assert headline(MODELS).startswith("# Gain of training over the best of 2 training-free baselines")
    assert headline({"base": {}, "extended": {}}).startswith("# No training-free scaling baseline was evaluated")
    assert headline({"extended": {}}).startswith("# No training-free baseline was evaluated")
    assert all(r["gain"] is None for r in gains({"control": MODELS["control"], "extended": MODELS["extended"]}))


def write_model(folder, needle_rows: dict[int, list[int]], ruler: dict[str, dict[str, float]] | None = None) -> None:
    """A model's result files as the evaluation programs write them: needle rows (one per prompt) and RULER scores."""
    rows = [{"length": n, "depth": 50.0, "correct": c} for n, values in needle_rows.items() for c in values]
    write_csv(rows, str(folder / "needle" / "results.csv"))
    if ruler:
        (folder / "ruler").mkdir()
        (folder / "ruler" / "results.json").write_text(json.dumps({"scores": ruler, "average": {}}))


def test_the_summary_files_carry_the_baselines_and_the_gain(tmp_path):
    write_model(tmp_path / "base", {256: [1, 1], 1024: [0, 0]}, {"vt": {"512": 0.0}})
    write_model(tmp_path / "yarn", {256: [1, 0], 1024: [1, 0]}, {"vt": {"512": 0.4}})
    (tmp_path / "base" / "ruler" / "results.json").write_text(json.dumps({"scores": {"vt": {"512": 0.0, "1024": 0.1}}}))
    write_model(tmp_path / "extended", {256: [1, 1], 1024: [1, 1]}, {"vt": {"512": 0.5, "1024": 0.0}})
    out = tmp_path / "results"
    args = [a for m in ("base", "yarn", "extended") for a in ("--model", f"{m}={tmp_path / m}")]
    assert compare.main([*args, "--base-length", "256", "--target-length", "1024", "--output", str(out)]) == 0
    md = (out / "summary.md").read_text().splitlines()
    assert md[0].startswith("# Gain of training over the best of 2 training-free baselines") and "(base, yarn)" in md[0]
    assert "| needle | 1K | extended | 1.00 | yarn | 0.50 | +0.50 |" in md  # 2/2 against yarn's 1/2
    assert "| vt | 512 | extended | 0.50 | yarn | 0.40 | +0.10 |" in md
    assert "| vt | 1K | extended | 0.00 | base (1 of 2 ran) | 0.10 | -0.10 |" in md  # yarn did not score 1K
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training_free_baselines"] == ["base", "yarn"]
    row = next(r for r in summary["gain_over_best_baseline"] if (r["task"], r["length"]) == ("needle", 256))
    assert (row["best_baseline"], row["best_baseline_score"], row["gain"]) == ("base", 1.0, 0.0)
    alone = tmp_path / "alone"
    assert compare.main(["--model", f"extended={tmp_path / 'extended'}", "--base-length", "256", "--target-length",
                         "1024", "--output", str(alone)]) == 0  # fmt: skip
    assert (alone / "summary.md").read_text().startswith("# No training-free baseline was evaluated")


def test_the_shorter_route_is_compared_on_its_own_not_as_a_training_free_baseline(tmp_path):
    """STAGE_YARN's model (the last stage + YaRN to the target) is not a training-free baseline: the summary gives
    the extended model's gain over it in a table and a JSON key of their own, computed by hand here."""
    route = {"needle": needle({256: 1.0, 1024: 0.75}), "ruler": {"scores": {"vt": {"512": 0.5}}}}
    models = {**MODELS, "stage_yarn": route}
    assert training_free(models) == ["base", "yarn"]
    assert gains(models) == gains(MODELS)  # the route changes no training-free gain
    got = {(r["task"], r["length"]): (r["best_baseline"], r["gain"]) for r in gains(models, against=["stage_yarn"])}
    assert got[("needle", 256)] == ("stage_yarn", pytest.approx(-0.2))
    assert got[("needle", 1024)] == ("stage_yarn", pytest.approx(0.25))
    assert got[("vt", 512)] == ("stage_yarn", pytest.approx(0.0))
    assert got[("fwe", 512)] == (None, None)
    assert gains(MODELS, against=["stage_yarn"]) == []  # not evaluated: no rows
    for m, rows in (("base", {1024: [0, 0]}), ("stage_yarn", {1024: [1, 0, 1, 1]}), ("extended", {1024: [1, 1]})):
        write_model(tmp_path / m, rows)
    out = tmp_path / "results"
    args = [a for m in ("base", "stage_yarn", "extended") for a in ("--model", f"{m}={tmp_path / m}")]
    assert compare.main([*args, "--base-length", "256", "--target-length", "1024", "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training_free_baselines"] == ["base"]
    (row,) = summary["gain_over_shorter_route"]
    assert (row["best_baseline"], row["best_baseline_score"], row["gain"]) == ("stage_yarn", 0.75, 0.25)
    md = (out / "summary.md").read_text()
    assert "Gain over the shorter route" in md and "| needle | 1K | extended | 1.00 | stage_yarn | 0.75 | +0.25 |" in md
    assert "stage_yarn (trained shorter, YaRN to the target)" in md


def test_a_miniature_summary_says_what_it_is(tmp_path):
    """``--caveat`` (the pipeline passes the CPU miniature's): summary.md's title and summary.json say it, before the
    tables a real run writes; without it the summary starts as before."""
    from easy_context.extend.micro import CAVEAT

    write_model(tmp_path / "base", {256: [0, 0]})
    write_model(tmp_path / "extended", {256: [0, 1]})
    args = [a for m in ("base", "extended") for a in ("--model", f"{m}={tmp_path / m}")]
    out = tmp_path / "micro"
    assert compare.main([*args, "--base-length", "256", "--target-length", "1024", "--output", str(out), "--caveat",
                         CAVEAT]) == 0  # fmt: skip
    md = (out / "summary.md").read_text().splitlines()
    assert md[0] == f"# {CAVEAT}" and "random weights" in md[0] and md[2].startswith("# No training-free scaling")
    assert json.loads((out / "summary.json").read_text())["caveat"] == CAVEAT
    real = tmp_path / "r"
    assert compare.main([*args, "--base-length", "256", "--target-length", "1024", "--output", str(real)]) == 0
    assert "caveat" not in json.loads((real / "summary.json").read_text())
