"""Every script takes both spellings of its long flags (``--seq-length`` = ``--seq_length``) and shows defaults."""

import os
import subprocess
import sys

import pytest

from easy_context import cli
from tests.support import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the top-level scripts (train.py, eval_*.py, plot.py)


def both(flag: str) -> list[str]:
    """``--seq-length`` -> ``["--seq-length", "--seq_length"]`` (in either order of the input's spelling)."""
    return [flag, *cli.other_spellings(flag)]


def test_other_spellings():
    assert cli.other_spellings("--seq-length") == ["--seq_length"]
    assert cli.other_spellings("--max_context_length") == ["--max-context-length"]
    assert cli.other_spellings("--a-b_c") == ["--a-b-c", "--a_b_c"]
    assert cli.other_spellings("--json") == []
    assert cli.other_spellings("-o") == []


def test_parser_both_spellings_one_dest_and_explicit_aliases():
    p = cli.ArgumentParser(prog="x")
    p.add_argument("--seq-length", type=int, default=16384, help="tokens")
    p.add_argument("--parallel_mode", "--parallel-mode", default="z", help="explicit alias pair")
    p.add_argument("--output", "-o", "--output-file", default=None, help="out")
    p.add_argument("--no-save", action="store_true", help="flag")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--train-tokenizer", type=int, help="in a group")
    for argv in (
        ["--seq-length", "8", "--parallel_mode", "a", "--output-file", "f", "--no-save", "--train-tokenizer", "3"],
        ["--seq_length", "8", "--parallel-mode", "a", "--output_file", "f", "--no_save", "--train_tokenizer", "3"],
        ["--seq_len", "8", "--parallel", "a", "-o", "f", "--no_s", "--train", "3"],  # abbreviations stay unique
    ):
        args = p.parse_args(argv)
        assert (args.seq_length, args.parallel_mode, args.output, args.no_save, args.train_tokenizer) == (
            8,
            "a",
            "f",
            True,
            3,
        ), argv
    text = p.format_help()
    assert "tokens (default: 16384)" in text
    assert "--seq-length SEQ_LENGTH" in text and "--seq_length" not in text.split("options:")[1].split("Every")[0]
    assert "--parallel_mode, --parallel-mode PARALLEL_MODE" in text
    assert "out\n" in text and "flag\n" in text  # no "(default: None)" / "(default: False)"
    assert cli.SPELLING_NOTE in text


def test_train_parse_args():
    import train

    base = ["--model", "tiny-llama", "--tokenizer", "X", "--dataset", "D"]
    for spelling in (0, 1):
        args = train.parse_args(
            base
            + [both("--output-dir")[spelling], "O", both("--seq-length")[spelling], "512"]
            + [both("--learning-rate")[spelling], "0.001", both("--parallel-mode")[spelling], "ulysses_attn"]
            + [both("--no-save")[spelling], both("--max-skips-in-a-row")[spelling], "3"]
        )
        assert (args.output_dir, args.seq_length, args.learning_rate, args.parallel_mode) == (
            "O",
            512,
            0.001,
            "ulysses_attn",
        )
        assert args.no_save and args.max_skips_in_a_row == 3


def test_eval_needle_parse_args():
    import eval_needle

    for spelling in (0, 1):
        args = eval_needle.parse_args(
            ["--model", "tiny-llama", "--tokenizer", "X"]
            + [both("--max_context_length")[spelling], "2048", both("--num_samples")[spelling], "2"]
            + [both("--rope_theta")[spelling], "1e6", both("--output-dir")[spelling], "O"]
        )
        assert (args.max_context_length, args.num_samples, args.rope_theta, args.output_dir) == (2048, 2, 1e6, "O")


def test_eval_ppl_parse_args():
    import eval_ppl

    for spelling in (0, 1):
        args = eval_ppl.parse_args(
            ["--model", "tiny-llama", "--tokenizer", "X"]
            + [both("--min-tokens")[spelling], "64", both("--dataset-min-tokens")[spelling], "100"]
            + [both("--output-file")[spelling], "o.csv", both("--sliding-window")[spelling], "32", "--no-concatenate"]
        )
        assert (args.min_tokens, args.dataset_min_tokens, args.output, args.sliding_window) == (64, 100, "o.csv", 32)
        assert args.concatenate is False


def test_plot_parse_args():
    import plot

    for spelling in (0, 1):
        args = plot.parse_args(["a.csv", both("--log-y")[spelling], "--title", "t"])
        assert args.log_y and args.csv == ["a.csv"] and args.title == "t"


def test_data_parse_args():
    from easy_context.data.__main__ import parse_args

    for spelling in (0, 1):
        args = parse_args(
            ["--dataset", "D", "--output", "O", both("--seq-length")[spelling], "128"]
            + [both("--train-tokenizer")[spelling], "500", both("--needle-fraction")[spelling], "0.5"]
            + [both("--no-progress")[spelling], both("--num-proc")[spelling], "2"]
        )
        assert (args.seq_length, args.train_tokenizer, args.needle_fraction, args.num_proc) == (128, 500, 0.5, 2)
        assert args.no_progress


def test_plan_parser():
    from easy_context.plan import build_parser

    p = build_parser()
    for spelling in (0, 1):
        args = p.parse_args(
            ["--model", "llama-3-8b", both("--gpu-mem")[spelling], "141GB", both("--loss-chunk")[spelling], "512"]
            + [both("--no-pinned-pow2")[spelling], both("--sp-size")[spelling], "4"]
        )
        assert (args.gpu_mem, args.loss_chunk, args.no_pinned_pow2, args.sp_size) == ("141GB", 512, True, 4)


HELP = {  # command -> a "(default: ...)" its --help must show
    "train.py": "(default: 16384)",
    "eval_needle.py": "(default: 8192)",
    "eval_ppl.py": "(default: 256)",
    "plot.py": "(default: auto)",
    "-m easy_context.data": "(default: 7)",
    "-m easy_context.plan": "(default: 80GB)",
}


@pytest.fixture(scope="module")
def helps():
    """Each script's ``--help``, run at once (each imports torch: seconds apiece)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    procs = {
        cmd: subprocess.Popen(
            [zygote.python(), *cmd.split(), "--help"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for cmd in HELP
    }
    out = {}
    for cmd, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[cmd] = (proc.returncode, stdout.decode(), stderr.decode())
    return out


@pytest.mark.parametrize("cmd", list(HELP))
def test_help_shows_defaults(helps, cmd):
    rc, stdout, stderr = helps[cmd]
    assert rc == 0, stderr[-2000:]
    text = " ".join(stdout.split())  # help lines wrap at the terminal width
    assert HELP[cmd] in text, stdout
    assert cli.SPELLING_NOTE in text
    assert "(default: None)" not in text and "(default: False)" not in text


@pytest.mark.parametrize("script", ["train.py", "eval_needle.py", "eval_ppl.py"])
def test_missing_model_folder_is_one_line(script):
    """A local model path that does not exist is named as such before anything loads (it used to read as a
    tokenizer problem, or as "Repo id must be in the form")."""
    extra = ["--dataset", "d", "--output-dir", "o", "--tokenizer", "t"] if script == "train.py" else []
    res = subprocess.run([zygote.python(), script, "--model", "./no/such/model", *extra], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2 and "--model ./no/such/model: no such folder" in res.stderr, res.stderr[-1000:]


def test_cpu_run_with_gpu_defaults_warns_once_with_the_fix():
    """bf16 or activation checkpointing on CPU: one warning naming the measured cost and the flags; none on GPU or
    with the CPU settings."""
    import types

    import torch

    from train import cpu_defaults_warning

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    slow = types.SimpleNamespace(dtype="bfloat16", checkpointing="full")
    message = cpu_defaults_warning(cpu, slow)
    assert "--dtype bfloat16 and --checkpointing full" in message and "--dtype float32 --checkpointing none" in message
    assert cpu_defaults_warning(gpu, slow) is None
    assert cpu_defaults_warning(cpu, types.SimpleNamespace(dtype="float32", checkpointing="none")) is None
    assert "--checkpointing attn" in cpu_defaults_warning(cpu, types.SimpleNamespace(dtype="float32",
                                                                                     checkpointing="attn"))  # fmt: skip


@pytest.mark.parametrize("script", ["train.py", "eval_needle.py", "eval_ppl.py"])
def test_launched_flag_error_is_printed_once(script):
    """Under a launcher every rank fails on the same bad flag: rank 0 prints one line (no usage block to bury it
    under the launcher's report), the other ranks nothing; both exit 2."""
    env = {**os.environ, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    outs = [subprocess.run([zygote.python(), script, "--no-such-flag"], cwd=ROOT, capture_output=True, text=True,
                           env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, timeout=120) for r in (0, 1)]  # fmt: skip
    assert [o.returncode for o in outs] == [2, 2]
    lines = outs[0].stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), outs[0].stderr
    assert "usage:" not in outs[0].stderr and outs[1].stderr == ""
