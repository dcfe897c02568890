"""GGUF files as a model source (easy_context.models.gguf): a tiny Llama written as GGUF loads with the HF model's
logits and tokenizer, converts to a plain folder, trains under 2-process SP and evaluates; one-line errors; RoPE
scaling (easy_context.models.parse_rope_scaling / set_rope_scaling)."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support import zygote
from tests.support.gguf_writer import tiny_llama, train_tokenizer, write_tiny_llama_gguf
from tests.support.jobs import run_job

pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
TEXTS = ["the model reads a long context", "where each word comes from, Über 123 in the text!", " spaces  and\nlines"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A tiny random Llama (float32) over a byte-level BPE, as GGUF files (F32 and Q8_0) and as an HF folder."""
    root = tmp_path_factory.mktemp("gguf")
    tokenizer = train_tokenizer(root / "tokenizer")
    model = tiny_llama(tokenizer)
    files = {
        q: write_tiny_llama_gguf(root / f"tiny-{q}.gguf", model, root / "tokenizer", quant=q) for q in ("F32", "Q8_0")
    }
    return {"root": root, "model": model, "tokenizer": tokenizer, **files}


def logits(model, n: int = 48) -> torch.Tensor:
    ids = torch.arange(n).remainder(model.config.vocab_size)[None] * 7 % model.config.vocab_size
    with torch.no_grad():
        return model(ids).logits.float()


def assert_plain(model) -> None:
    assert getattr(model, "hf_quantizer", None) is None and not hasattr(model.config, "quantization_config")
    assert all(p.requires_grad and not p.is_meta for p in model.parameters())


def test_gguf_loads_with_the_hf_models_logits_and_tokenizer(tiny, tmp_path):
    from easy_context.models import load_model, missing_local_path
    from easy_context.models.gguf import is_gguf, split_gguf
    from easy_context.models.tokenizer import load_tokenizer

    ref = logits(tiny["model"])
    f32 = load_model(tiny["F32"], dtype=torch.float32)
    assert_plain(f32)
    assert type(f32).__name__ == "LlamaForCausalLM" and f32.config.tie_word_embeddings
    torch.testing.assert_close(logits(f32), ref, atol=1e-5, rtol=0)
    q8 = load_model(tiny["Q8_0"], dtype=torch.float32)
    assert_plain(q8)
    err = (logits(q8) - ref).abs().max().item()
    assert 0 < err < 0.02 * ref.abs().max().item(), err  # quantized (not equal), yet close
    assert load_model(tiny["Q8_0"]).dtype == torch.bfloat16  # the default dtype
    tok = load_tokenizer(tiny["F32"])
    for text in TEXTS:
        assert tok(text).input_ids == tiny["tokenizer"](text).input_ids
        assert tok.decode(tok(text).input_ids) == text
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    # build_config's overrides apply to GGUF models too: RoPE base and context size
    theta = load_model(tiny["F32"], dtype=torch.float32, rope_theta=500.0, max_position_embeddings=4096)
    assert theta.config.rope_parameters["rope_theta"] == 500.0 and theta.config.max_position_embeddings == 4096
    assert not torch.allclose(logits(theta), ref, atol=1e-4)
    # a folder holding one .gguf (and no config.json) names it; missing_local_path accepts an existing file
    folder = tmp_path / "one"
    folder.mkdir()
    os.link(tiny["F32"], folder / "model.gguf")
    assert is_gguf(str(folder)) and split_gguf(str(folder)) == (str(folder), "model.gguf")
    torch.testing.assert_close(logits(load_model(str(folder), dtype=torch.float32)), ref, atol=1e-5, rtol=0)
    assert missing_local_path(tiny["F32"]) is None and missing_local_path(str(folder)) is None
    (folder / "config.json").write_text("{}")
    assert not is_gguf(str(folder)) and is_gguf("x/model.GGUF")


def test_gguf_special_tokens_follow_the_file(tiny, monkeypatch):
    """A transformers version that reads a special token wrong (5.17 gave SmolLM2's eos as its bos) is corrected to
    the ids the file names (tokenizer.ggml.*_token_id)."""
    import transformers

    from easy_context.models.gguf import load_gguf_tokenizer

    real = transformers.AutoTokenizer.from_pretrained

    def wrong_eos(*args, **kwargs):
        tok = real(*args, **kwargs)
        tok.eos_token = tok.bos_token
        return tok

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", wrong_eos)
    tok = load_gguf_tokenizer(tiny["F32"])
    assert (tok.bos_token, tok.eos_token, tok.eos_token_id) == ("<s>", "</s>", tiny["tokenizer"].eos_token_id)


def test_convert_gguf_writes_a_plain_folder(tiny, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from easy_context.models import convert_gguf, load_model

    out = tmp_path / "plain"
    assert convert_gguf(tiny["Q8_0"], str(out), dtype=torch.float32) == str(out)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    # transformers 4.x's RoPE keys beside rope_parameters (easy_context.models.config_compat)
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] and config["rope_scaling"] is None
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    convert_gguf(tiny["Q8_0"], str(out))  # already converted: nothing rewritten
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    expected = logits(load_model(tiny["Q8_0"], dtype=torch.float32))
    monkeypatch.setitem(sys.modules, "gguf", None)  # the folder loads without gguf
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert_plain(reloaded)
    torch.testing.assert_close(logits(reloaded), expected, atol=1e-6, rtol=0)
    tok = AutoTokenizer.from_pretrained(out)
    assert [tok(t).input_ids for t in TEXTS] == [tiny["tokenizer"](t).input_ids for t in TEXTS]


def test_gguf_trains_under_sp_saves_a_plain_folder_and_evaluates(tmp_path):
    """The miniature: a GGUF file (Q8_0) -> 2-process zigzag training -> a plain HF folder -> eval_ppl.py."""
    rng = random.Random(0)
    words = "the model reads a long context and learns where each word comes from in the text".split()
    (tmp_path / "docs").mkdir()
    for i in range(6):
        text = " ".join(
            words[(j * 7 + i) % len(words)] if rng.random() < 0.8 else rng.choice(words) for j in range(2000)
        )
        (tmp_path / "docs" / f"doc{i}.txt").write_text(text)
    data = tmp_path / "prepared"
    subprocess.run([zygote.python(), "-m", "easy_context.data", "--dataset", str(tmp_path / "docs"), "--output",
                    str(data), "--seq-length", "256", "--train-tokenizer", "300"],
                   check=True, capture_output=True, cwd=ROOT)  # fmt: skip
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(data / "tokenizer")
    model = tiny_llama(tokenizer)
    q8 = write_tiny_llama_gguf(tmp_path / "tiny-q8.gguf", model, data / "tokenizer", quant="Q8_0")
    f32 = write_tiny_llama_gguf(tmp_path / "tiny-f32.gguf", model, data / "tokenizer")
    model.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    out = tmp_path / "trained"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu_2proc.yaml",
           "--num_processes", "2", "train.py", "--model", q8, "--dataset", str(data), "--output-dir", str(out),
           "--seq-length", "256", "--batch-size", "2", "--gradient-accumulate-every", "1", "--max-train-steps", "3",
           "--learning-rate", "3e-3", "--warmup-steps", "1", "--dtype", "float32", "--checkpointing", "none",
           "--parallel_mode", "zigzag_ring_attn", "--seed", "0"]  # fmt: skip  # the tokenizer comes from the GGUF
    res = run_job(cmd, cwd=ROOT, env=ENV, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and rows[-1]["loss"] < rows[0]["loss"]
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    check = "import sys; sys.modules['gguf'] = None; from transformers import AutoModelForCausalLM as M; "
    check += f"m = M.from_pretrained({str(out)!r}); assert getattr(m, 'hf_quantizer', None) is None; print('ok')"
    assert subprocess.run([zygote.python(), "-c", check], capture_output=True, text=True).stdout.strip() == "ok"
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == len(tokenizer)
    csv_path = tmp_path / "ppl.csv"
    cmd = [sys.executable, "eval_ppl.py", "-m", str(out), "-m", f32, "-m", str(tmp_path / "hf"), "--dataset",
           str(tmp_path / "docs"), "--min-tokens", "64", "--max-tokens", "128", "--sliding-window", "64",
           "--samples", "2", "--output", str(csv_path)]  # fmt: skip
    res = run_job(cmd, cwd=ROOT, env=ENV, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(csv_path, newline="") as f:
        ppl = {(r["model"], int(r["tokens"])): float(r["ppl"]) for r in csv.DictReader(f)}
    assert len(ppl) == 6
    for n in (64, 128):  # the GGUF file scores as its HF original; training lowered the perplexity
        assert ppl[(f32, n)] == pytest.approx(ppl[(str(tmp_path / "hf"), n)], rel=1e-5)
        assert ppl[(str(out), n)] < ppl[(f32, n)]


def test_gguf_errors_are_one_line_and_say_what_to_do(tiny, tmp_path, monkeypatch):
    from easy_context.models import load_model, missing_local_path
    from easy_context.models.tokenizer import load_tokenizer

    model = tiny["model"]
    # truncated, or not a GGUF at all
    data = Path(tiny["F32"]).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    (tmp_path / "html.gguf").write_bytes(b"<html>404 not found</html>")
    for name, what in [("cut.gguf", "truncated or corrupt GGUF file"), ("html.gguf", "not a GGUF file")]:
        path = str(tmp_path / name)
        with pytest.raises(ValueError, match=what):
            load_model(path, dtype=torch.float32)
        message = missing_local_path(path)
        assert message.startswith(f"--model {path}: {what}") and "\n" not in message
    assert missing_local_path(str(tmp_path / "absent.gguf")) == f"--model {tmp_path / 'absent.gguf'}: no such GGUF file"
    # an architecture transformers cannot read from GGUF: the message lists those it can
    foo = write_tiny_llama_gguf(tmp_path / "foo.gguf", model, tiny["root"] / "tokenizer", arch="foo")
    with pytest.raises(ValueError, match=r"architecture 'foo' cannot be loaded from GGUF .* it loads .*llama") as e:
        load_model(foo, dtype=torch.float32)
    assert "\n" not in str(e.value)
    # a tensor type gguf cannot dequantize: named, with the ones that work
    f64 = write_tiny_llama_gguf(tmp_path / "f64.gguf", model, tiny["root"] / "tokenizer", quant="F64")
    with pytest.raises(ValueError, match=r"tensors of type F64, which gguf .* cannot dequantize; .*Q8_0"):
        load_model(f64, dtype=torch.float32)
    # no tokenizer metadata: the model loads, the tokenizer says to pass --tokenizer
    bare = write_tiny_llama_gguf(tmp_path / "bare.gguf", model, None)
    torch.testing.assert_close(logits(load_model(bare, dtype=torch.float32)), logits(model), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="holds no tokenizer .*pass --tokenizer DIR"):
        load_tokenizer(bare)
    # gguf not installed (a file not read before: the header check is cached per file)
    fresh = write_tiny_llama_gguf(tmp_path / "fresh.gguf", model, None)
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(RuntimeError, match=r"needs the gguf package: pip install 'easy_context\[gguf\]'"):
        load_model(fresh, dtype=torch.float32)
    assert "pip install 'easy_context[gguf]'" in missing_local_path(fresh, "--tokenizer")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("yarn:8", {"rope_type": "yarn", "factor": 8.0}),
        ("yarn:8:8192", {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}),
        ("Dynamic:4", {"rope_type": "dynamic", "factor": 4.0}),
        ("linear:2.5", {"rope_type": "linear", "factor": 2.5}),
    ],
)
def test_parse_rope_scaling(text, expected):
    from transformers import LlamaConfig

    from easy_context.models import parse_rope_scaling

    assert parse_rope_scaling(text) == expected
    with_config = parse_rope_scaling(text, LlamaConfig(max_position_embeddings=4096))
    if expected["rope_type"] == "linear":
        assert with_config == expected
    else:  # the original length defaults to the config's
        assert with_config == {"original_max_position_embeddings": 4096, **expected}


@pytest.mark.parametrize("text", ["yarn", "rope:8", "yarn:x", "yarn:1", "yarn:-2", "linear:4:100", "yarn:8:0",
                                  "yarn:8:1.5", "yarn:8:1:2", ""])  # fmt: skip
def test_parse_rope_scaling_errors(text):
    from easy_context.models import parse_rope_scaling

    with pytest.raises(ValueError, match="rope scaling") as e:
        parse_rope_scaling(text)
    assert "\n" not in str(e.value)


def test_rope_scaling_reaches_the_model(tiny, tmp_path):
    from easy_context.models import build_config, load_model, parse_rope_scaling

    tiny["model"].save_pretrained(tmp_path / "hf")  # max_position_embeddings 512

    def build(scaling=None, **kw):
        rope = parse_rope_scaling(scaling) if scaling else None
        return load_model(str(tmp_path / "hf"), dtype=torch.float32, rope_scaling=rope, **kw).eval()

    base = build()
    original = base.config.max_position_embeddings
    long, short = original + 64, 32
    yarn = build("yarn:4", rope_theta=5e5, max_position_embeddings=2 * original)
    assert yarn.config.rope_parameters == {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5,
                                           "original_max_position_embeddings": original}  # fmt: skip
    assert yarn.config.max_position_embeddings == 2 * original
    assert yarn.model.rotary_emb.rope_type == "yarn"
    ref = build(rope_theta=5e5)
    assert not torch.allclose(logits(yarn, long), logits(ref, long), atol=1e-5)  # beyond the original length
    dynamic = build("dynamic:4", max_position_embeddings=2 * original)  # dynamic NTK scales from the original
    assert dynamic.config.max_position_embeddings == original
    torch.testing.assert_close(logits(dynamic, short), logits(base, short), atol=1e-6, rtol=0)
    assert not torch.allclose(logits(dynamic, long), logits(base, long), atol=1e-5)
    linear = build("linear:4")
    assert linear.config.rope_parameters["rope_type"] == "linear"
    assert not torch.allclose(logits(linear, short), logits(base, short), atol=1e-5)
    config = build_config("tiny-llama", vocab_size=128, rope_scaling=parse_rope_scaling("yarn:2:64"))
    assert config.rope_parameters["original_max_position_embeddings"] == 64
    gguf = load_model(tiny["F32"], dtype=torch.float32, rope_scaling=parse_rope_scaling("yarn:4"))
    assert gguf.config.rope_parameters["rope_type"] == "yarn"
    torch.testing.assert_close(logits(gguf, long), logits(build("yarn:4"), long), atol=1e-5, rtol=0)
