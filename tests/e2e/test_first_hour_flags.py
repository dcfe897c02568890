"""What a new user mistypes is refused in one line with exit code 2, before anything loads: numbers a flag cannot
mean (``--max-train-steps 0``, ``--batch-size 0``), and a model path that does not exist read as a hub id."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess

import pytest

from easy_context import cli
from easy_context.eval import run_needle, run_ppl
from easy_context.models import source
from easy_context.train import build_parser
from easy_context.train import parse_args as train_parse_args
from tests.support import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = ["--model", "tiny-llama", "--dataset", "random", "--vocab-size", "8", "--output-dir", "o"]
NEEDLE = ["--model", "tiny-llama", "--tokenizer", "t"]
PPL = ["--model", "tiny-llama", "--tokenizer", "t"]
PARSERS = {"train": train_parse_args, "needle": run_needle.parse_args, "ppl": run_ppl.parse_args}
BASE = {"train": TRAIN, "needle": NEEDLE, "ppl": PPL}
CHECKED = {cli.positive_int, cli.non_negative_int, cli.positive_float, cli.non_negative_float, cli.fraction,
           cli.decay_rate, run_needle.depth_step}  # fmt: skip


def one_line_error(capsys, script: str, argv: list[str]) -> str:
    """The single stderr line ``script``'s parse_args exits with (exit code 2)."""
    with pytest.raises(SystemExit) as exc:
        PARSERS[script]([*BASE[script], *argv])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Each script's parser, as its parse_args builds it (the evals retype shared flags after adding them)."""
    built = {"train": build_parser()}
    for name, module in (("needle", run_needle), ("ppl", run_ppl)):
        captured = {}
        original = cli.ArgumentParser.parse_args

        def grab(self, *args, _captured=captured, **kwargs):
            _captured["parser"] = self
            raise SystemExit(0)

        cli.ArgumentParser.parse_args = grab
        try:
            with pytest.raises(SystemExit):
                module.parse_args(BASE[name])
        finally:
            cli.ArgumentParser.parse_args = original
        built[name] = captured["parser"]
    return built


def test_every_numeric_flag_has_a_checking_type():
    """No flag of train.py or the evals takes a bare int or float: each says what it cannot be."""
    bare = [(name, a.option_strings[0]) for name, p in parsers().items() for a in p._actions
            if a.type in (int, float)]  # fmt: skip
    assert not bare, bare
    checked = sum(a.type in CHECKED for p in parsers().values() for a in p._actions)
    assert checked >= 35, checked


BAD = [
    ("train", "--max-train-steps", "0", "an integer >= 1"),
    ("train", "--max-train-steps", "-3", "an integer >= 1"),
    ("train", "--batch-size", "0", "an integer >= 1"),
    ("train", "--seq-length", "0", "an integer >= 1"),
    ("train", "--learning-rate", "0", "a number > 0"),
    ("train", "--learning-rate", "nan", "a number > 0"),
    ("train", "--warmup-steps", "-1", "an integer >= 0"),
    ("train", "--grad-clip", "-1", "a number >= 0"),
    ("train", "--save-every", "-2", "an integer >= 0"),
    ("train", "--sp-size", "0", "an integer >= 1"),
    ("train", "--ring_degree", "0", "an integer >= 1"),
    ("train", "--seed", "-1", "an integer >= 0"),
    ("train", "--rope-theta", "-5", "a number > 0"),
    ("train", "--time-limit", "-1", "a number >= 0"),
    ("train", "--stop-at-step", "0", "an integer >= 1"),
    ("train", "--checkpoint-every", "0", "an integer >= 1"),
    ("train", "--batch-size", "two", "expected an integer >= 1, got 'two'"),
    ("needle", "--num_samples", "0", "an integer >= 1"),
    ("needle", "--num_distractor", "-1", "an integer >= 0"),
    ("needle", "--max_context_length", "0", "an integer >= 1"),
    ("needle", "--depth_interval", "0", "a number > 0"),
    ("needle", "--depth_interval", "101", "a percent in (1, 100]"),
    ("needle", "--rope_theta", "0", "a number > 0"),
    ("needle", "--seed", "-1", "an integer >= 0"),
    ("ppl", "--min-tokens", "0", "an integer >= 1"),
    ("ppl", "--sliding-window", "0", "an integer >= 1"),
    ("ppl", "--samples", "0", "an integer >= 1"),
    ("ppl", "--tokens-step", "-4", "an integer >= 1"),
]


@pytest.mark.parametrize("script,flag,value,rule", BAD, ids=[f"{s}{f}={v}" for s, f, v, _ in BAD])
def test_meaningless_number_is_one_line(capsys, script, flag, value, rule):
    line = one_line_error(capsys, script, [flag, value])
    assert f"argument {flag}" in line and rule in line and line.endswith("--help)"), line
    assert f"argument {flag}: " in line, line  # one spelling, not all of them


def test_adam_betas_in_zero_one(capsys):
    assert "a number in [0, 1), got 1" in one_line_error(capsys, "train", ["--adam-betas", "0.9", "1"])
    assert train_parse_args([*TRAIN, "--adam-betas", "0", "0.95"]).adam_betas == [0.0, 0.95]


@pytest.mark.parametrize(
    "script,argv,message",
    [
        ("needle", ["--min_context_length", "2048", "--max_context_length", "1024"], "--min_context_length <="),
        ("ppl", ["--min-tokens", "1"], "need 2 <= --min-tokens"),
        ("ppl", ["--min-tokens", "512", "--max-tokens", "256"], "--min-tokens <= --max-tokens"),
    ],
)
def test_lengths_out_of_order_are_one_line(capsys, script, argv, message):
    assert message in one_line_error(capsys, script, argv)


def test_zeros_that_mean_off_are_taken():
    args = train_parse_args([*TRAIN, "--save-every", "0", "--grad-clip", "0", "--warmup-steps", "0", "--seed", "0",
                             "--tiled-mlp", "0", "--time-limit", "0"])  # fmt: skip
    assert (args.save_every, args.grad_clip, args.warmup_steps, args.seed, args.tiled_mlp) == (0, 0, 0, 0, 0)
    assert run_needle.parse_args([*NEEDLE, "--num_distractor", "0", "--depth_interval", "25"]).depth_interval == 25


@pytest.mark.parametrize(
    "script,argv,message",
    [
        ("train.py", ["--model", "tiny-llama", "--dataset", "random", "--vocab-size", "8", "--output-dir", "o",
                      "--max-train-steps", "0"], "argument --max-train-steps: must be an integer >= 1, got 0"),
        ("eval_needle.py", [*NEEDLE, "--num_samples", "0"], "argument --num_samples: must be an integer >= 1, got 0"),
        ("eval_ppl.py", [*PPL, "--sliding-window", "0"], "argument --sliding-window: must be an integer >= 1, got 0"),
    ],
)  # fmt: skip
def test_scripts_exit_2_with_one_line(script, argv, message):
    res = subprocess.run([zygote.python(), script, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines() == [f"{script}: error: {message} (see {script} --help)"], res.stderr


# ---------------------------------------------------------------------------------------------------------------
# a missing local path read as a hub id


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: the refusals below come before the network."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network attempt: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("offline", ["1", ""])
@pytest.mark.parametrize(
    "name,reading",
    [
        ("out/llama2-64k", "out/ is an output folder name, not a hub organization"),
        ("checkpoints/run1", "checkpoints/ is an output folder name"),
        ("my run/model", "not a hub id (those look like org/name)"),
        ("org--x/model", "not a hub id"),
    ],
)
def test_missing_path_is_not_taken_for_a_hub_id(capsys, monkeypatch, no_network, tmp_path, offline, name, reading):
    monkeypatch.chdir(tmp_path)  # a fresh clone: out/ does not exist yet
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", offline)
    for script in PARSERS:
        argv = ["--model", name] if script != "train" else ["--model", name, "--dataset", "random", "--output-dir", "o"]
        with pytest.raises(SystemExit) as exc:
            PARSERS[script](argv)
        assert exc.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"--model {name}: no local folder of that name" in lines[0], lines
        assert reading in lines[0] and "pass an existing folder or a hub id org/name" in lines[0], lines


def test_existing_parent_folder_means_a_local_path(capsys, monkeypatch, no_network, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs2").mkdir()
    assert "(though runs2/ is one here), so not read as a hub id" in one_line_error(
        capsys, "needle", ["--model", "runs2/final"]
    )


def test_offline_uncached_hub_id_is_refused_cached_is_taken(capsys, monkeypatch, no_network, tmp_path):
    from huggingface_hub import constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert source.hub_cache_dir() == str(tmp_path / "hub")
    monkeypatch.delenv("HF_HUB_CACHE")
    assert source.hub_cache_dir() == constants.HF_HUB_CACHE  # huggingface_hub's own answer, in this environment
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))  # the name huggingface_hub still reads
    assert source.hub_cache_dir() == str(tmp_path / "legacy")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = one_line_error(capsys, "ppl", ["--model", "meta-llama/Llama-2-7b-hf"])
    assert "is not in the hub cache (offline: HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set)" in line, line
    (tmp_path / "hub" / "models--meta-llama--Llama-2-7b-hf" / "snapshots" / "abc").mkdir(parents=True)
    assert run_ppl.parse_args([*PPL, "--model", "meta-llama/Llama-2-7b-hf"]).model[-1] == "meta-llama/Llama-2-7b-hf"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")  # online, a plausible id is the hub's to answer
    assert source.model_source_error("someone/some-model") is None


def test_existing_folder_preset_and_tokenizer_flag(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "demo").mkdir(parents=True)
    assert source.model_source_error("out/demo") is None and source.model_source_error("tiny-llama") is None
    assert source.model_source_error("shape:llama-2-7b") is None and source.model_source_error(None) is None
    assert source.model_source_error("out/tok", "--tokenizer").startswith("--tokenizer out/tok: no local folder")
    assert "no such folder" in source.model_source_error("./out/absent")  # models.missing_local_path's rule


def test_train_script_refuses_the_readme_path_fast():
    """The README's example output path, before it exists: one line, exit 2, no hub traceback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}
    argv = ["train.py", "--model", "out/llama2-64k", "--dataset", "random", "--output-dir", "o"]
    res = subprocess.run([zygote.python(), *argv], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr[-2000:]
    assert "--model out/llama2-64k: no local folder of that name" in res.stderr


def test_help_states_a_default_once():
    """A help text that names its default itself gets no second "(default: ...)" appended."""
    p = cli.ArgumentParser(prog="x")
    p.add_argument("--lengths", default=[4096, 8192], help="lengths in tokens (default 4096,8192)")
    p.add_argument("--seq-length", type=cli.positive_int, default=16384, help="tokens")
    text = " ".join(p.format_help().split())
    assert text.count("default") == 2 and "(default 4096,8192)" in text and "tokens (default: 16384)" in text
