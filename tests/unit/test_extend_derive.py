"""The derived extension recipes (easy_context.extend.derive) against the hand-written ones (train_scripts/*.yaml), the
RoPE bound, and the planner's own answers; the recipe dataclass's YAML round trip and its one-line errors."""

from __future__ import annotations

import math

import pytest
import yaml

from easy_context.extend import rope_base
from easy_context.extend.cli import main
from easy_context.extend.derive import _shape, derive, learning_rate, model_config, round_up_nice, stage_lengths
from easy_context.extend.recipe import Recipe, Stage, parse_length
from easy_context.plan.options import parse_config
from easy_context.plan.setup import Setup
from easy_context.plan.solve import predict

# the public config.json values of each model
SMOLLM2 = dict(
    model_type="llama",
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rope_theta=1e5,
    max_position_embeddings=8192,
    vocab_size=49152,
    tie_word_embeddings=True,
)
GEMMA3 = dict(
    model_type="gemma3_text",
    hidden_size=640,
    intermediate_size=2048,
    num_hidden_layers=18,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    sliding_window=512,
    rope_theta=1e6,
    rope_local_base_freq=1e4,
    max_position_embeddings=32768,
    vocab_size=262144,
)
LLAMA3_8B = dict(
    model_type="llama",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    rope_theta=5e5,
    max_position_embeddings=8192,
    vocab_size=128256,
)
QWEN25_7B = dict(
    model_type="qwen2",
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    rope_theta=1e6,
    max_position_embeddings=131072,
    sliding_window=131072,
    use_sliding_window=False,
    vocab_size=152064,
)
MISTRAL_7B = dict(
    model_type="mistral",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,  # v0.3
    num_attention_heads=32,
    num_key_value_heads=8,
    rope_theta=1e6,
    max_position_embeddings=32768,
    sliding_window=None,
    vocab_size=32768,
)
GPT_OSS_20B = dict(
    model_type="gpt_oss",
    hidden_size=2880,
    intermediate_size=2880,
    num_hidden_layers=24,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    sliding_window=128,
    rope_theta=150000,
    rope_scaling=dict(
        rope_type="yarn", factor=32.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0
    ),
    max_position_embeddings=131072,
    vocab_size=201088,
    num_local_experts=32,
    num_experts_per_tok=4,
)
K = 1024


def hand(name: str) -> Recipe:
    return Recipe.load(f"train_scripts/{name}.yaml")


@pytest.mark.parametrize("name", ["smollm2_64k", "gemma3_256k", "gemma3_1m"])
def test_the_hand_written_recipes_load_and_round_trip(name):
    original = yaml.safe_load(open(f"train_scripts/{name}.yaml"))
    recipe = Recipe.load(f"train_scripts/{name}.yaml")
    written = yaml.safe_load(recipe.to_yaml("header"))
    assert Recipe.from_mapping(written) == recipe
    for key, value in original.items():  # every key comes back with its value
        if key != "pipeline":
            assert written[key] == value, key
    assert all(written["pipeline"][k] == v for k, v in original["pipeline"].items())


def test_the_hand_written_key_values():
    smol, gemma = hand("smollm2_64k"), hand("gemma3_256k")
    assert (smol.target, smol.rope_theta, smol.stages, smol.tokens) == (65536, 1e7, (), 65536 * 350)
    assert [s.seq_length for s in gemma.all_stages] == [128 * K, 256 * K]
    assert gemma.tokens == 128 * K * 60 + 256 * K * 40 and gemma.stages[0].checkpointing == "attn"


@pytest.mark.parametrize(("change", "field"), [
    ({"seq-length": "64K"}, "seq-length"), ({"rope-theta": -1}, "rope-theta"), ({"checkpointing": "some"},
    "checkpointing"), ({"parallel_mode": "ring"}, "parallel_mode"), ({"batch-size": 0}, "batch-size"),
])  # fmt: skip
def test_a_bad_value_is_refused_in_one_line_naming_its_key(change, field):
    mapping = hand("smollm2_64k").to_mapping() | change
    with pytest.raises(ValueError, match=f"recipe {field}:") as info:
        Recipe.from_mapping(mapping)
    assert "\n" not in str(info.value)


def test_a_bad_stage_names_its_index():
    mapping = hand("gemma3_256k").to_mapping()
    mapping["pipeline"]["stages"][0]["seq-length"] = 1 << 20  # longer than the target
    with pytest.raises(ValueError, match=r"pipeline.stages\[0\].seq-length"):
        Recipe.from_mapping(mapping)
    with pytest.raises(ValueError, match=r"stages\[0\].warmup-steps"):
        Stage.from_mapping({"seq-length": 8, "max-train-steps": 1, "warmup-steps": -1}, "stages[0]")


@pytest.mark.parametrize(("text", "tokens"), [("262144", 262144), ("256K", 262144), ("1M", 1 << 20),
                                              ("1.5M", 3 << 19), (65536, 65536)])  # fmt: skip
def test_length_syntax(text, tokens):
    assert parse_length(text) == tokens


@pytest.mark.parametrize("text", ["64Q", "1G", "", "0", "0.3K"])
def test_unknown_length_syntax_names_the_fix(text):
    with pytest.raises(ValueError, match="262144, 256K or 1M|at least 1"):
        parse_length(text)


def test_the_rules_building_blocks():
    assert stage_lengths(32 * K, 256 * K) == [128 * K]  # x4 per stage
    assert stage_lengths(8 * K, 1 << 20) == [32 * K, 128 * K, 512 * K]
    assert [round_up_nice(x) for x in (8.99e6 * 2, 1.01, 2.2e3, 4.9)] == [2e7, 2.0, 2.5e3, 5.0]
    assert learning_rate(7e9)[0] == 2e-5 and learning_rate(65e9)[0] == 1e-5  # PI's own rates, reproduced


def test_the_tabled_bound_is_the_scan():
    """A fast table entry against the scan it tables (the others take minutes: bench/rope_base_table.py)."""
    assert math.isclose(rope_base.STABLE_BOUNDS[(128, 8192)], rope_base.min_rope_base(128, 8192, stable=True),
                        rel_tol=0.005)  # fmt: skip


def test_smollm2_to_64k_on_one_141gb_gpu():
    d = derive(SMOLLM2, 64 * K, gpus=1, gpu_mem="141GB", name="smollm2")
    r, smol = d.recipe, hand("smollm2_64k")
    # the same: the length, micro-batch, one GPU data parallel, cosine AdamW (0.9, 0.95), chunked loss, no stage at
    # the target's length besides the main one, the evaluation lengths and baselines
    assert (r.target, r.micro_batch, r.grad_accum, r.parallel_mode, r.loss) == (smol.target, 1, 1, "data_parallel",
                                                                               "chunked")  # fmt: skip
    assert (r.needle_min, r.needle_step, r.baselines, r.kernel_fallback) == (8192, 8192, smol.baselines, "cudnn")
    # the rules differ (docs/extension.md): the base 5e8 (2x the stable bound 1.36e8; the YAML's 1e7 fails the
    # bound), a 32K stage first (x4), 0.5B x 135M / 7B tokens (the YAML: one 540 s device call), full checkpointing
    # (the planner has no 'none')
    assert r.rope_theta == 5e8 and not rope_base.satisfies_bound(smol.rope_theta, 64, 64 * K)
    assert [s.seq_length for s in r.all_stages] == [32 * K, 64 * K]
    assert math.isclose(r.tokens, 0.5e9 * 134.5e6 / 7e9, rel_tol=0.01) and r.tokens < smol.tokens / 2
    assert r.checkpointing == "full" and smol.checkpointing == "none"
    assert r.learning_rate == 6.8e-5  # the YAML: 1e-4
    assert "Fu et al." in r.to_yaml() and "# the planner" in r.to_yaml()


def test_gemma3_to_256k_on_one_141gb_gpu():
    d = derive(GEMMA3, 256 * K, gpus=1, gpu_mem="141GB", name="gemma3")
    r, gemma = d.recipe, hand("gemma3_256k")
    assert r.rope_theta == gemma.rope_theta == 2e7  # 2 x the stable bound 9.07e6, rounded up
    assert [s.seq_length for s in r.all_stages] == [s.seq_length for s in gemma.all_stages] == [128 * K, 256 * K]
    assert math.isclose(r.tokens, gemma.tokens, rel_tol=0.06)  # 19.4M vs 18.4M (steps rounded up)
    assert [s.steps for s in r.all_stages] == [74, 37]  # equal tokens per stage (the YAML: 60, 40)
    assert math.isclose(r.learning_rate, gemma.learning_rate, rel_tol=0.1)  # 5.5e-5 vs 5e-5
    assert (r.micro_batch, r.parallel_mode, r.kernel_fallback) == (1, "data_parallel", "auto")
    assert r.baselines == gemma.baselines and (r.needle_min, r.needle_step) == (32 * K, 32 * K)
    # the planner's full+chunked at 256K with transformers' eager norms (Gemma's four a layer, the q/k norms): 32 GB;
    # the measured run (gemma3_256k.yaml: 24.2 GiB = 26.0 GB) compiled its norms (--compile), which keeps none of the
    # eager fp32 copies: the plan is an upper bound of it, within 25 %
    assert r.checkpointing == "full" and 26.0 < d.plans[-1].gpu_bytes / 1e9 < 1.25 * 26.0
    assert "the global layers only" in r.why["rope-theta"]


def test_llama3_8b_to_1m_on_8x80gb_fits_with_ulysses_and_offload_at_1m():
    d = derive(LLAMA3_8B, 1 << 20, gpus=8, gpu_mem="80GB", name="llama3")
    r = d.recipe
    assert [s.seq_length for s in r.all_stages] == [32 * K, 128 * K, 512 * K, 1 << 20]
    assert r.rope_theta == 5e9 and (r.parallel_mode, r.sp_size) == ("ulysses_attn", None)  # 32 and 8 heads / 8
    assert [p.config for p in d.plans] == ["full+chunked"] * 3 + ["offload+chunked"]
    assert {p.optim for p in d.plans} == {"zero3"} and r.learning_rate == 1.9e-5
    # the planner's own answer: full checkpointing stops short of 1M at this layout, offload reaches it
    assert d.plans[-1].max_seq >= 1 << 20 > d.plans[-2].max_seq and d.plans[-1].sp_size == 8


def test_qwen25_7b_to_256k_on_one_141gb_gpu_offloads_the_optimizer():
    d = derive(QWEN25_7B, 256 * K, gpus=1, gpu_mem="141GB", name="qwen2.5")
    r, plan = d.recipe, d.plans[-1]
    assert r.stages == () and r.rope_theta == 1e8  # 128K native (the config): one x2 stage
    # the optimizer's fp32 state in host memory: train.py's host_adamw (no DeepSpeed), ZeRO-3's offload's bytes
    assert (plan.optim, plan.config, r.tiled_mlp is not None) == ("host_adamw", "full+tiled+chunked", True)
    assert r.settings["optim"] == "host_adamw" and "--optimizer host_adamw" in plan.train_flags
    # several processes: never host_adamw (train.py refuses a whole optimizer state in each process's host memory)
    assert derive(QWEN25_7B, 256 * K, gpus=2, gpu_mem="141GB", name="qwen2.5").recipe.settings["optim"] != "host_adamw"
    assert plan.gpu_bytes < 141e9 <= plan.gpu_bytes * 1.2  # fits, not by much


def test_mistral_7b_to_128k_on_4x80gb_takes_sp2_x_dp2():
    d = derive(MISTRAL_7B, 128 * K, gpus=4, gpu_mem="80GB", name="mistral")
    r = d.recipe
    assert (r.parallel_mode, r.sp_size, r.stages, r.rope_theta) == ("ulysses_attn", 2, (), 5e7)
    # the planner: SP 2 fits 128K with full checkpointing; SP 1 (data parallel) does not
    shape = _shape(model_config(MISTRAL_7B), "mistral")
    setup = Setup(gpus=4, gpu_mem=80e9, host_mem=1e12, sp_size=1, optim="zero3")
    one = predict(shape, setup, "data_parallel", parse_config("full+chunked"))
    assert one.max_seq < 128 * K <= d.plans[-1].max_seq and shape.heads % 2 == 0


def test_gpt_oss_20b_to_128k_is_refused_it_is_native():
    with pytest.raises(ValueError, match=r"already covers 128K tokens \(max_position_embeddings=131072\); give --to "
                                         r"above it, e\.g\. 256K"):  # fmt: skip
        derive(GPT_OSS_20B, 128 * K, gpus=8, gpu_mem="80GB", name="gpt-oss-20b")


def test_a_target_past_the_planners_longest_is_refused_naming_the_knob_that_makes_it_fit():
    """The advice names the fewest GPUs that fit (planned again here: that many fit, half as many do not)."""
    with pytest.raises(ValueError, match=r"does not fit 1 x H100 \(80 GB, .*planned again, it fits with --gpus \d+$"
                       ) as info:  # fmt: skip
        derive(LLAMA3_8B, 1 << 20, gpus=1, gpu_mem="80GB", name="llama3")
    assert "\n" not in str(info.value)
    gpus = int(str(info.value).rsplit(" ", 1)[1])
    assert derive(LLAMA3_8B, 1 << 20, gpus=gpus, gpu_mem="80GB").recipe.target >= 1 << 20
    with pytest.raises(ValueError, match="does not fit"):
        derive(LLAMA3_8B, 1 << 20, gpus=gpus // 2, gpu_mem="80GB")


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(target=4 * K), "give --to above it"), (dict(gpus=0), "give at least 1 GPU"),
])  # fmt: skip
def test_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        derive(SMOLLM2, **{"target": 64 * K, **kwargs})


def test_the_command_writes_the_recipe_it_prints(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(__import__("json").dumps(GEMMA3))
    out = tmp_path / "r.yaml"
    assert main(["--model", str(tmp_path / "m"), "--to", "256K", "--gpu-mem", "141GB", "--write-recipe", str(out),
                 "--dry-run"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "stage 1: 128K x 74 steps" in text and "main: 256K x 37 steps" in text and "--seq-length 262144" in text
    assert Recipe.load(out).rope_theta == 2e7
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path / "m"), "--to", "1G"])
    assert "262144, 256K or 1M" in capsys.readouterr().err
