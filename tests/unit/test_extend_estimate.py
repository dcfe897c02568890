"""The plan's estimates (easy_context.extend.estimate, derive, cli): numbers in units that read (no 0.0M tokens or
~0.00 h for a tiny plan), time for the named GPU (its datasheet peak), the pipeline's data and evaluations counted
from its own commands, the host memory assumed said in the plan."""

from __future__ import annotations

import math
import re

import pytest

from easy_context.extend import estimate
from easy_context.extend.cli import describe, main, pipeline_settings
from easy_context.extend.derive import derive
from easy_context.extend.recipe import Recipe
from easy_context.extend.settings import resolve

K = 1024
TINY = dict(model_type="llama", hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=32000, max_position_embeddings=2048)  # fmt: skip
SMOLLM2 = dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, rope_theta=1e5, vocab_size=49152, max_position_embeddings=8192,
               tie_word_embeddings=True)  # fmt: skip


@pytest.mark.parametrize(("n", "text"), [(0, "0"), (512, "512"), (1000, "1K"), (12_345, "12.3K"), (319_488, "319K"),
                                         (4_850_000, "4.85M"), (1.2e9, "1.2B")])  # fmt: skip
def test_tokens_read_in_their_unit(n, text):
    assert estimate.format_tokens(n) == text


@pytest.mark.parametrize(("s", "text"), [(0.00179, "1.79 ms"), (0.172, "172 ms"), (1.0, "1 s"), (59.4, "59.4 s"),
                                         (90, "1.5 min"), (3600 * 2.49, "2.49 h"),
                                         (86400 * 3.1, "3.1 days")])  # fmt: skip
def test_durations_read_in_their_unit(s, text):
    assert estimate.format_seconds(s) == text


def test_step_time_scales_with_the_named_gpus_datasheet_peak():
    """The same plan on an H200 (989 TFLOP/s dense bf16, datasheet) and an L4 (121): every step 989/121 times longer;
    memory defaults to the named GPU's (L40S: 48 GB)."""
    h200 = derive(SMOLLM2, 64 * K, gpu="h200", host_mem="128GB")
    l4 = derive(SMOLLM2, 64 * K, gpu="l4", gpu_mem="141GB", host_mem="128GB")
    for fast, slow in zip(h200.plans, l4.plans):
        assert math.isclose(slow.step_seconds / fast.step_seconds, 989 / 121, rel_tol=1e-12)
    assert "1 x H200 (141 GB, 989 TFLOP/s dense bf16)" in h200.hardware
    assert "141 GB GPU (timed as an L4: 121 TFLOP/s" in l4.hardware
    assert "1 x L40S (48 GB, 362 TFLOP/s" in derive(SMOLLM2, 64 * K, gpu="l40s", host_mem="128GB").hardware
    with pytest.raises(ValueError, match=r"--gpu v100: not a GPU this table knows; give one of h200, .*a100"):
        derive(SMOLLM2, 64 * K, gpu="v100")


def test_evaluation_sequences_are_the_pipelines_commands(tmp_path):
    """A tiny Llama 2K -> 8K with BASELINES=base, 1 needle sample, 2 perplexity documents, no control, RULER or needle
    beyond: the base and the extended model each run the needle at 2K, 4K, 6K, 8K (5 depths, 1 sample), the needle
    with distractors (2 samples), perplexity at 2K and 2K, 4K, 8K (2 documents): counted by hand from the commands."""
    recipe = derive(TINY, 8 * K, host_mem="64GB").recipe
    path = recipe.write(str(tmp_path / "r.yaml"), "test")
    env = {"BASELINES": "base", "SAMPLES": "1", "PPL_SAMPLES": "2", "CONTROL": "0", "RULER": "0", "LONG": ""}
    settings = resolve(path, env)
    needle = 5 * (2 + 4 + 6 + 8) * K
    per_model = needle + 2 * needle + 2 * (2 + 2 + 4 + 8) * K
    assert sum(n * c for n, c in estimate.evaluation_sequences(settings)) == 2 * per_model


def test_a_tiny_plan_prints_real_numbers_and_counts_data_and_evaluations(tmp_path):
    derived = derive(TINY, 32 * K, host_mem="64GB")
    text = describe(derived, pipeline_settings(derived.recipe, None))
    assert not re.search(r"\b0\.0+ ?(M|h|s)\b|~0 ", text), text
    assert re.search(r"main: 32K x \d+ steps = \d+K tokens; .* ~[\d.]+ ms a step", text), text
    assert "  data: ~" in text and "  evaluations: ~" in text and "  control: ~" in text
    parts = {m[0]: m[1] for m in re.findall(r"^  (stage 1|main|data|evaluations|control): .*?~([\d.]+ \w+)", text,
                                            re.M)}  # fmt: skip
    seconds = {"ms": 1e-3, "s": 1, "min": 60, "h": 3600}
    total = sum(float(v.split()[0]) * seconds[v.split()[1]] for v in parts.values())
    total_text = re.search(r"in all: .*?, ~([\d.]+) (\w+) \(training", text).groups()
    assert math.isclose(float(total_text[0]) * seconds[total_text[1]], total, rel_tol=0.02), text


def test_the_host_memory_assumed_is_said(tmp_path, capsys):
    config = tmp_path / "tiny"
    config.mkdir()
    (config / "config.json").write_text(__import__("json").dumps(TINY))
    assert main(["--model", str(config), "--to", "8K", "--dry-run"]) == 0
    assert "GB host (host: this machine's RAM; --host-mem for the training machine's)" in capsys.readouterr().out
    assert main(["--model", str(config), "--to", "8K", "--host-mem", "2TB", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2,000 GB host;" in out and "this machine's RAM" not in out


def test_nothing_fits_says_so_not_zero_tokens():
    big = dict(TINY, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8)  # fmt: skip
    with pytest.raises(ValueError, match="not one token fits") as info:
        derive(big, 32 * K, gpu_mem="8GB", host_mem="8GB")
    assert "0 tokens" not in str(info.value)


def test_a_recipes_stages_read_as_tokens(tmp_path):
    from easy_context.extend.cli import describe_recipe

    path = "train_scripts/smollm2_64k.yaml"
    text = describe_recipe(Recipe.load(path), resolve(path, {}))
    assert "main: 64K x 350 steps = 22.9M tokens (1 sequence a step)" in text, text
    text = describe_recipe(Recipe.load(path), resolve(path, {"NPROC": "2", "STEPS": "10"}))  # as it would run
    assert "data_parallel on 2 processes" in text and "main: 64K x 10 steps = 1.31M tokens (2 sequences a step)" in text
