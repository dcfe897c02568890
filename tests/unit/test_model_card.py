"""easy_context.extend.model_card: the card of the Gemma recipe's miniature (its summary.json, config.json and
run_config.json files, as test_micro_pipeline_end_to_end's run wrote them: tests/fixtures/micro_gemma3_card) carries
summary.json's numbers, parsed back from the card's tables; the front matter names the base and license of a known
fetch source; the card's transformers snippet loads the model."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "micro_gemma3_card"
GAIN_HEADER = "| task | length | model | score | best training-free baseline | its score | gain |"


@pytest.fixture
def work(tmp_path) -> Path:
    """The miniature's work folder: base (no run record), stage1_512 and extended (their run_config.json naming the
    model each started from), results/summary.json."""
    work = tmp_path / "w"
    shutil.copytree(FIXTURE, work)
    for record in work.glob("*/run_config.json"):
        record.write_text(record.read_text().replace("WORK", str(work)))
    (work / "base").mkdir(exist_ok=True)
    return work


def table(lines: list[str], header: str) -> list[list[str]]:
    """The cells of the markdown table that starts with ``header``."""
    start = lines.index(header) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_card_numbers_equal_the_summary(work):
    """The gain table, the training runs and the perplexities parsed back from the card equal summary.json's. The
    miniature's 4 random steps score 0 everywhere: each gain row gets distinct numbers first, so a row printed in the
    wrong place shows."""
    from easy_context.eval.compare import _k
    from easy_context.extend.model_card import write_card

    summary_path = work / "results" / "summary.json"
    summary = json.loads(summary_path.read_text())
    for i, row in enumerate(summary["gain_over_best_baseline"]):
        row["score"], row["best_baseline_score"] = round(0.9 - 0.05 * i, 4), round(0.02 * i, 4)
        row["gain"] = round(row["score"] - row["best_baseline_score"], 4)
    summary_path.write_text(json.dumps(summary))
    path = write_card(str(work), hardware="cpu x 2")
    assert path == str(work / "extended" / "README.md")
    text = Path(path).read_text()
    front = yaml.safe_load(text.split("---")[1])
    config = json.loads((work / "extended" / "config.json").read_text())
    assert front["context_length"] == config["max_position_embeddings"] == summary["target_length"] == 1024
    assert front["library_name"] == "transformers" and {"long-context", "easy_context"} <= set(front["tags"])
    assert "base_model" not in front and "license" not in front  # a random miniature: no known source
    lines = text.splitlines()
    gains = table(lines, GAIN_HEADER)
    expected = summary["gain_over_best_baseline"]
    assert len(gains) == len(expected) > 10
    for row, want in zip(gains, expected):
        task, length, model, score, best, best_score, gain = row
        assert (task, length, model) == (want["task"], _k(want["length"]), want["model"])
        assert float(score) == pytest.approx(want["score"], abs=0.005)
        assert best.split(" (")[0] == want["best_baseline"].split(" (")[0]
        assert float(best_score) == pytest.approx(want["best_baseline_score"], abs=0.005)
        assert float(gain) == pytest.approx(want["gain"], abs=0.005)
    assert "Gain of training over the best of 2 training-free baselines" in text
    runs = {r[0]: r for r in table(lines, next(line for line in lines if line.startswith("| run | length |")))}
    for name, stage in summary["training_stages"].items():
        assert runs[name][2] == str(stage["steps"]) and runs[name][3] == f"{stage['tokens']:,}"
        assert runs[name][7] == str(stage["loss"])
    assert [runs[n][1] for n in ("stage1_512", "extended")] == ["512", "1024"]
    ppl = {r[0]: r for r in table(lines, next(line for line in lines if line.startswith("| model | short |")))}
    for name, m in summary["models"].items():
        assert float(ppl[name][1]) == pytest.approx(next(iter(m["ppl_short"].values())), rel=1e-5)
    assert "- Hardware: cpu x 2." in lines
    assert f"vllm serve {work / 'extended'} --max-model-len 1024" in text
    assert f"easy-context-export {work / 'extended'} --gguf extended-q8_0.gguf --type q8_0" in text
    # transformers 4.x reads the legacy RoPE keys: the card says whether config.json carries them
    assert "Caution: config.json holds only transformers 5's `rope_parameters`" in text
    (work / "extended" / "config.json").write_text(
        json.dumps({**config, "rope_theta": 4e6, "rope_local_base_freq": 1e4})
    )
    text = Path(write_card(str(work))).read_text()
    assert "Caution" not in text and "for it (rope_theta, rope_local_base_freq) beside transformers 5's" in text


def test_card_names_a_known_source_and_its_snippet_loads_the_model(work, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from easy_context.extend.model_card import main
    from easy_context.models.fetch import get_source
    from tests.support.gguf_writer import train_tokenizer

    gemma = get_source("gemma3-270m")
    (work / "base" / "gguf").mkdir()
    (work / "base" / "gguf" / gemma.gguf).write_bytes(b"GGUF")  # what easy-context-fetch leaves in its folder
    model = work / "extended"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).save_pretrained(model)
    train_tokenizer(model)
    assert main([str(work), "--results", str(work / "results")]) == 0
    text = (model / "README.md").read_text()
    front = yaml.safe_load(text.split("---")[1])
    assert (front["base_model"], front["license"]) == ("google/gemma-3-270m", "gemma")
    assert f"Base: {gemma.title}; license: {gemma.license}." in text
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(snippet, scope)  # the card's own code
    assert type(scope["model"]).__name__ == "Gemma3ForCausalLM" and len(scope["tokenizer"]) == 300
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "nowhere")])
    assert (
        str(e.value) == f"error: {tmp_path / 'nowhere' / 'extended'}: no config.json (the extended model's folder; "
        "--model names it)"
    )
