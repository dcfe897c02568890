"""The README's and docs' code blocks that claim to run do run: each is read from its file (so the text cannot drift
from what is tested) and executed, the distributed ones on 2 and 4 gloo ranks against single-device attention. A
mixed-up layout that can be detected raises: a shard cut for another backend, a whole sequence given to a sharded
model."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

import easy_context as ec
from tests.support import zygote
from tests.support.models import tiny_model
from tests.support.reference import rel_err

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- runs in tests/e2e/test_first_hour_docs.py -->"
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)


def marked_blocks(path: Path) -> list[tuple[str, str]]:
    """(language, code) of each fenced block that follows the marker line in ``path``."""
    text = path.read_text()
    return [FENCE.match(text, m.end() + 1).groups() for m in re.finditer(re.escape(MARK), text)]


def block(path: str, index: int = 0) -> str:
    return marked_blocks(ROOT / path)[index][1]


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_marker_precedes_a_block():
    marked = {p.name: len(marked_blocks(p)) for p in doc_files() if MARK in p.read_text()}
    assert marked.get("README.md", 0) >= 1 and marked.get("api.md", 0) >= 1, marked


# ---------------------------------------------------------------------------------------------------------------
# the functional API on 2 and 4 ranks


def run_api_block(rank: int, world: int, code: str, mix: bool) -> float:
    """Execute the docs' functional-API block on this rank; the error of its ``out`` against one device's attention
    (``mix``: shard with zigzag as the old README did, attend as the block says)."""
    if mix:
        old = "ec.extract_local(seq_algo, t, rank, world_size, dim=1, **options)"
        assert old in code
        code = code.replace(old, 'ec.extract_local("zigzag_ring_attn", t, rank, world_size, dim=1)')
    scope: dict = {}
    exec(compile(code, "docs/api.md", "exec"), scope)
    q, k, v = (t.double().transpose(1, 2) for t in (scope["q"], scope["k"], scope["v"]))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    want = ec.extract_local(scope["seq_algo"], ref, rank, world, dim=1, **scope["options"])
    return rel_err(scope["out"].double(), want)


@pytest.mark.parametrize("world", [2, 4])
def test_functional_api_block_matches_one_device(dist_pool, world):
    code = block("docs/api.md")
    assert "extract_local(seq_algo" in code and "get_attn_func(seq_algo" in code  # one backend for both
    for err in dist_pool(world).run(run_api_block, code, False):
        assert err < 1e-5, err


def test_a_shard_of_another_layout_is_refused_on_4_ranks(dist_pool):
    """zigzag shards attended by usp_attn(ring_degree=2): the same rows on 2 ranks (no error, right numbers), other
    rows on 4 (the old README's snippet was off by up to 1.5 there): every rank raises, naming the fix."""
    code = block("docs/api.md")
    for err in dist_pool(2).run(run_api_block, code, True):
        assert err < 1e-5, err
    with pytest.raises(Exception, match=r"sharded by extract_local\('zigzag_ring_attn'\), whose layout differs"):
        dist_pool(4).run(run_api_block, code, True)


@pytest.mark.parametrize("index", [0, 1])
def test_api_blocks_run_as_their_launch_line_says(tmp_path, index):
    """Each distributed block of docs/api.md, saved under the name its first line gives, runs with the torchrun
    command written there: every rank prints its line and the launch exits 0."""
    import sys

    from tests.support.jobs import run_job

    code = block("docs/api.md", index)
    name, command = re.match(r"# (\S+), run as: (torchrun [^(]*?) \(", code.splitlines()[0]).groups()
    words = shlex.split(command)
    assert words[0] == "torchrun" and words[-1] == name and "--nproc_per_node" in words
    (tmp_path / name).write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    res = run_job([sys.executable, "-m", "torch.distributed.run", *words[1:]], timeout=300, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    world = int(words[words.index("--nproc_per_node") + 1])
    # two ranks write to one pipe: their lines can interleave without a newline between them
    assert sorted(re.findall(r"rank (\d+): ", res.stdout)) == [str(r) for r in range(world)], res.stdout


# ---------------------------------------------------------------------------------------------------------------
# a switched model and transformers' own loss on 2 and 4 ranks


def run_model_block(rank: int, world: int, code: str) -> tuple[float, float]:
    """Execute the docs' switched-model block on this rank: (its all-reduced loss, the one-process model's
    transformers loss with its own attention on the whole batch)."""
    from transformers import AutoModelForCausalLM

    scope: dict = {}
    exec(compile(code, "docs/api.md", "exec"), scope)
    reference = AutoModelForCausalLM.from_config(scope["config"], attn_implementation="eager")
    reference.load_state_dict(scope["model"].state_dict())
    return scope["loss"].item(), reference(scope["input_ids"], labels=scope["labels"]).loss.item()


@pytest.mark.parametrize("world", [2, 4])
def test_model_loss_block_matches_one_process(dist_pool, world):
    code = block("docs/api.md", 1)
    assert "shift_labels=shard" in code and "num_items_in_batch=" in code
    for loss, reference in dist_pool(world).run(run_model_block, code):
        assert abs(loss - reference) < 1e-5 * reference, (loss, reference)


# ---------------------------------------------------------------------------------------------------------------
# a patched model given the whole sequence on every rank


def whole_sequence_worker(rank: int, world: int, seq_algo: str, sharded: bool) -> float:
    options = {"ring_degree": 2} if seq_algo == "usp_attn" else {}
    ids = torch.randint(0, 128, (1, 16 * world), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(ids.shape[1])[None]
    reference = tiny_model("llama")(ids, position_ids=positions).logits
    model = ec.apply_seq_parallel_monkey_patch(seq_algo, tiny_model("llama"), **options)
    if sharded:
        local = ec.prepare_seq_parallel_inputs(seq_algo, ids, positions, None, rank, world, "cpu", **options)
        logits = model(local["local_input_ids"], position_ids=local["local_position_ids"]).logits
        return rel_err(logits, ec.extract_local(seq_algo, reference, rank, world, **options))
    try:
        logits = model(ids, position_ids=positions).logits  # zigzag: rank 0's logits were off by 0.54, silently
    except ValueError as exc:
        assert "put together by" in str(exc) and "every rank must pass its own shard" in str(exc), exc
        return -1.0
    return rel_err(logits, reference)


@pytest.mark.parametrize("world,seq_algo", [(2, "zigzag_ring_attn"), (4, "zigzag_ring_attn"), (4, "usp_attn")])
def test_whole_sequence_to_a_sharded_model(dist_pool, world, seq_algo):
    """zigzag: refused on every rank. usp_attn (ring 2 x Ulysses 2) places each rank's rows contiguously: the copies
    read as W packed documents of one sequence each, and every rank computes the whole sequence's right logits (W
    times the work, no wrong number): nothing to refuse, docs/api.md says so."""
    whole = dist_pool(world).run(whole_sequence_worker, seq_algo, False)
    if seq_algo == "zigzag_ring_attn":
        assert whole == [-1.0] * world
    else:
        assert max(whole) < 1e-5, whole
    for err in dist_pool(world).run(whole_sequence_worker, seq_algo, True):
        assert err < 1e-5, err


def test_position_layout_rule():
    from easy_context.core.layout import position_layout_error

    assert position_layout_error("z", torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2]])) is None  # packed documents
    assert position_layout_error("z", torch.tensor([[5, 6, 7, 0, 1]])) is None  # a row starting mid-document
    error = position_layout_error("zigzag_ring_attn", torch.tensor([[0, 1, 0, 1, 2, 3, 2, 3]]))
    assert "jump from 3 to 2 at token 6" in error, error


# ---------------------------------------------------------------------------------------------------------------
# the README's CPU training command, and the flags of the commands that need GPUs


def test_readme_cpu_training_command_runs(tmp_path):
    """The README's one CPU training command, as written (its output dir moved to tmp_path)."""
    lines = block("README.md").replace("\\\n", " ").splitlines()
    command = next(line for line in lines if "train.py" in line)
    words = shlex.split(command.split("#")[0])
    env = dict(os.environ)
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    assert words[:2] == ["accelerate", "launch"], words
    out = words.index("--output-dir") + 1
    words[out] = str(tmp_path / "run")
    res = subprocess.run([zygote.python(), "-m", "accelerate.commands.launch", *words[2:]], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "run" / "model.safetensors").exists() and (tmp_path / "run" / "metrics.jsonl").exists()


def train_commands() -> list[tuple[str, list[str]]]:
    """(file, train.py flags) of every train.py command in a bash block of the README and the docs."""
    found = []
    for path in doc_files():
        for lang, code in FENCE.findall(path.read_text()):
            if lang not in ("bash", "sh"):
                continue
            for line in code.replace("\\\n", " ").splitlines():
                words = shlex.split(line.split(" #")[0], posix=True) if "train.py" in line else []
                for i, word in enumerate(words):
                    if word.endswith("train.py") or word in ("easy_context.train", "easy-context-train"):
                        found.append((path.name, words[i + 1 :]))
                        break
    return found


def test_documented_train_commands_parse():
    """Every train.py command the README and docs show takes flags train.py has (GPU recipes cannot run here; their
    flags can still be checked)."""
    from easy_context.train import build_parser

    commands = [(name, flags) for name, flags in train_commands() if "..." not in flags and "$" not in " ".join(flags)]
    assert len(commands) >= 3, commands
    parser = build_parser()
    for action in parser._actions:
        action.required = False  # a command may take them from its --config recipe
    for name, flags in commands:
        end = next((i for i, f in enumerate(flags) if f in ("&&", "|", ";", ">", "2>&1")), len(flags))
        try:
            _, unknown = parser.parse_known_args(flags[:end])
        except SystemExit:
            pytest.fail(f"{name}: train.py {' '.join(flags[:end])}")
        assert not unknown, (name, unknown)


# ---------------------------------------------------------------------------------------------------------------
# the --help examples of the scripts


@pytest.mark.parametrize("module,script", [("easy_context.eval.run_needle", "eval_needle.py"),
                                           ("easy_context.eval.run_ppl", "eval_ppl.py"),
                                           ("easy_context.train", "train.py")])  # fmt: skip
def test_help_examples_parse(monkeypatch, tmp_path, module, script):
    """Each example command in a script's --help (its module docstring) parses, names the demo's real output dir, and
    keeps its line continuations (a non-raw docstring joined them into one line)."""
    import importlib

    mod = importlib.import_module(module)
    doc = mod.__doc__
    assert "out/demo/model" not in doc and "\\\n" in doc
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "demo" / "extended").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the examples' hub ids are checked by form only, never fetched
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    parsed = 0
    for line in doc.replace("\\\n", " ").splitlines():
        words = shlex.split(line.split("#")[0]) if script in line and "..." not in line else []
        if words:
            mod.parse_args(words[words.index(script) + 1 :])
            parsed += 1
    assert parsed >= 1


def test_readme_first_screen():
    """The README fits one screen (<= 60 lines) and holds the two commands, the CPU command and the way on."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 60
    for needle in ("make demo", "make test", "ACCELERATE_USE_CPU=1", "docs/README.md", "easy-context-fetch"):
        assert needle in text, needle
    assert re.search(r"\(\d{4}-\d{2}-\d{2}", text)  # numbers carry their date
