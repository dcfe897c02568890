"""The checkpoints we write load with their trained RoPE under transformers 4.x and 5.x alike
(easy_context.models.config_compat): the legacy keys beside ``rope_parameters``, checked against transformers
4.57.6 itself, installed in its own dir (requirements-tf4.txt; ``make`` puts it in .venv/tf4, $EC_TF4) and run in a
subprocess with that dir first on PYTHONPATH, the venv's torch serving both."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from easy_context.models import set_rope_scaling, set_rope_theta
from easy_context.models.config_compat import (
    LegacyRopeError,
    add_legacy_rope_keys,
    legacy_rope_keys,
    with_legacy_rope_keys,
)
from tests.support import rope_probe
from tests.support.models import tiny_model

ROOT = Path(__file__).resolve().parents[2]
TF4 = Path(os.environ.get("EC_TF4", str(ROOT / ".venv" / "tf4")))
TF4_VERSION = "4.57.6"
HOLD_A_3 = ROOT / "results" / "extension_gemma3" / "hold_a_3" / "work.tgz"
ORIGINAL = 32  # the tiny models' pretrained length: the probe's sequence runs past it
SEQ = 80
# a 270M-shaped config's RoPE without its size: the probe builds (not loads) a model of this shape
SMALL = dict(num_hidden_layers=6, vocab_size=256, hidden_size=64, intermediate_size=16)


def tf4_dir() -> Path:
    """The transformers 4.x install dir; built with pip when missing (pip works wherever the suite's venv was
    built). Where it cannot be built: skipped on a developer's machine, a failure under CI=true."""
    if (TF4 / "transformers").is_dir():
        return TF4
    temp = TF4.with_name(TF4.name + ".building")
    shutil.rmtree(temp, ignore_errors=True)  # an interrupted build's
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(temp), "-r",
           str(ROOT / "requirements-tf4.txt")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        os.replace(temp, TF4)
        return TF4
    why = f"transformers {TF4_VERSION} not installable into {TF4}: {proc.stderr.strip()[-300:]}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(why)
    pytest.skip(why)


def run_tf4(requests: list[dict], tmp: Path) -> dict:
    """rope_probe under transformers 4.x: ``{"transformers": version, "results": {name: probe}}``."""
    request = tmp / "request.json"
    request.write_text(json.dumps(requests))
    out = tmp / "tf4.pt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tf4_dir()),
                                                                          "OMP_NUM_THREADS": "1"}  # fmt: skip
    proc = subprocess.run([sys.executable, rope_probe.__file__, str(request), str(out)], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


def write_checkpoint(model, out: Path) -> Path:
    """``model`` saved by train.py's writer (save_hf_checkpoint), as a training run's wrapper hands it over."""
    from easy_context.training.train_state import save_hf_checkpoint

    wrapper = torch.nn.Module()
    wrapper.model = model
    accelerator = SimpleNamespace(get_state_dict=lambda m: m.state_dict(), unwrap_model=lambda m: m,
                                  is_main_process=True)  # fmt: skip
    out.mkdir(parents=True)
    save_hf_checkpoint(accelerator, wrapper, None, out)
    return out


def extended_models() -> dict:
    """Tiny random models as an extension leaves them: non-default bases, one YaRN-, one linear-scaled; Gemma 3
    with its sliding layers' base moved too (4.x reads that one from rope_local_base_freq)."""
    llama = tiny_model("llama", seed=1, max_position_embeddings=ORIGINAL, tie_word_embeddings=True)
    set_rope_theta(llama.config, 1e5)  # SmolLM2's base (Llama's default is 10000)
    set_rope_scaling(llama.config, {"rope_type": "yarn", "factor": 4.0})
    qwen2 = tiny_model("qwen2", seed=2, max_position_embeddings=ORIGINAL)
    set_rope_theta(qwen2.config, 3e5)
    set_rope_scaling(qwen2.config, {"rope_type": "linear", "factor": 3.0})
    layer_types = ["sliding_attention", "sliding_attention", "full_attention"]
    gemma = tiny_model("gemma3_text", seed=3, max_position_embeddings=ORIGINAL, layer_types=layer_types,
                       num_hidden_layers=3)  # fmt: skip
    set_rope_theta(gemma.config, 4e6)  # the global layers' (the CPU miniature of gemma3_256k)
    gemma.config.rope_parameters["sliding_attention"]["rope_theta"] = 2e4
    set_rope_scaling(gemma.config, {"rope_type": "yarn", "factor": 8.0})
    return {"llama": llama, "qwen2": qwen2, "gemma3": gemma}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """The models, their folders (train.py's writer), and the same folders without the legacy keys (how they were
    written before), plus the hold A Gemma 3 256K config as it was written and rewritten."""
    root = tmp_path_factory.mktemp("compat")
    models = extended_models()
    folders = {name: write_checkpoint(model, root / name) for name, model in models.items()}
    bare = root / "gemma3_bare"
    bare.mkdir()
    values = json.loads((folders["gemma3"] / "config.json").read_text())
    for key in ("rope_theta", "rope_scaling", "rope_local_base_freq"):
        values.pop(key)
    (bare / "config.json").write_text(json.dumps(values))
    hold = {}
    with tarfile.open(HOLD_A_3) as tar:
        text = tar.extractfile("extended/config.json").read()
    for state in ("before", "after"):
        hold[state] = root / f"hold_a_3_{state}"
        hold[state].mkdir()
        (hold[state] / "config.json").write_bytes(text)
    add_legacy_rope_keys(hold["after"])
    return {"root": root, "models": models, "folders": folders, "bare": bare, "hold": hold}


def test_legacy_keys_flat_scaled_partial_and_multimodal():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192, "rope_theta": 1e5,
            "beta_fast": 32.0, "partial_rotary_factor": 0.5}  # fmt: skip
    assert legacy_rope_keys({"model_type": "llama", "rope_parameters": yarn}) == {
        "rope_theta": 1e5,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192,
                         "beta_fast": 32.0},
        "partial_rotary_factor": 0.5,
    }  # fmt: skip
    plain = {"model_type": "qwen2", "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    assert legacy_rope_keys(plain) == {"rope_theta": 1e6, "rope_scaling": None}
    assert legacy_rope_keys({"model_type": "gpt2"}) == {}
    gemma = {"model_type": "gemma3_text", "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}  # fmt: skip
    expected = {"rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rope_local_base_freq": 1e4}
    assert legacy_rope_keys(gemma) == expected
    multimodal = with_legacy_rope_keys({"model_type": "gemma3", "text_config": gemma})
    assert multimodal["text_config"] == gemma | expected and "rope_theta" not in multimodal


def test_inexpressible_rope_is_named_and_the_file_left_as_it_was(tmp_path):
    both = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    params = {"sliding_attention": both, "full_attention": dict(both, rope_theta=1e6)}
    gemma = {"model_type": "gemma3_text", "rope_parameters": params}
    with pytest.raises(LegacyRopeError, match="sliding layers' RoPE is scaled"):
        legacy_rope_keys(gemma)
    other = {"model_type": "other", "rope_parameters": {"a": {"rope_theta": 1.0}, "b": {"rope_theta": 2.0}}}
    with pytest.raises(LegacyRopeError, match="RoPE per layer type"):
        legacy_rope_keys(other)
    assert legacy_rope_keys(dict(other, rope_parameters={"a": {"rope_theta": 5.0}, "b": {"rope_theta": 5.0}})) == {
        "rope_theta": 5.0, "rope_scaling": None}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(gemma))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        add_legacy_rope_keys(tmp_path)
    assert any("4.x loads the family default RoPE" in str(w.message) for w in caught)
    assert json.loads((tmp_path / "config.json").read_text()) == gemma


def test_stale_legacy_keys_are_rewritten_from_rope_parameters(tmp_path):
    """transformers 5 lets the legacy keys override rope_parameters: a stale one would win, so the writer derives
    them from rope_parameters every time, whatever the file held."""
    from transformers import AutoConfig

    model = tiny_model("llama", max_position_embeddings=ORIGINAL)
    set_rope_theta(model.config, 1e5)
    model.config.save_pretrained(tmp_path)
    values = json.loads((tmp_path / "config.json").read_text())
    stale = dict(values, rope_theta=5.0, rope_scaling={"rope_type": "linear", "factor": 2.0})
    (tmp_path / "config.json").write_text(json.dumps(stale))
    assert AutoConfig.from_pretrained(tmp_path).rope_parameters["rope_theta"] == 5.0  # the precedence, as it is
    add_legacy_rope_keys(tmp_path / "config.json")
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["rope_theta"], written["rope_scaling"]) == (1e5, None)
    assert AutoConfig.from_pretrained(tmp_path).rope_parameters == model.config.rope_parameters


def test_transformers_5_reads_the_same_rope_from_the_written_files(saved):
    from transformers import AutoConfig

    for name, folder in saved["folders"].items():
        values = json.loads((folder / "config.json").read_text())
        assert "rope_theta" in values and "rope_scaling" in values, name
        assert AutoConfig.from_pretrained(folder).rope_parameters == saved["models"][name].config.rope_parameters
    gemma = json.loads((saved["folders"]["gemma3"] / "config.json").read_text())
    assert (gemma["rope_theta"], gemma["rope_local_base_freq"], gemma["rope_scaling"]["factor"]) == (4e6, 2e4, 8.0)


def test_transformers_4_loads_the_trained_rope_and_logits(saved, tmp_path):
    """The written checkpoints under transformers 4.57.6: the rotary frequencies per layer type and the logits past
    the pretrained length equal transformers 5's; the same Gemma 3 folder without the legacy keys (as written
    before) gets 4.x's default global base; hold A's Gemma-3-270M 256K config: 1e6 as written, 2e7 rewritten."""
    ids = (torch.arange(SEQ) * 7 % 128)[None].tolist()
    requests = [{"name": n, "folder": str(f), "ids": ids} for n, f in saved["folders"].items()]
    requests.append({"name": "gemma3_bare", "folder": str(saved["bare"]), "ids": None, "overrides": {}})
    requests += [{"name": f"hold_{s}", "folder": str(f), "ids": None, "overrides": SMALL}
                 for s, f in saved["hold"].items()]  # fmt: skip
    tf4 = run_tf4(requests, tmp_path)
    assert tf4["transformers"] == TF4_VERSION
    got = tf4["results"]
    for name, folder in saved["folders"].items():
        want = rope_probe.probe(str(folder), ids)
        assert want["rotary"].keys() == got[name]["rotary"].keys(), name
        for layer_type, (inv_freq, scaling) in want["rotary"].items():
            torch.testing.assert_close(got[name]["rotary"][layer_type][0], inv_freq, rtol=1e-6, atol=0)
            assert got[name]["rotary"][layer_type][1] == pytest.approx(scaling, rel=1e-6), (name, layer_type)
        torch.testing.assert_close(got[name]["logits"], want["logits"], rtol=0, atol=1e-5)
    head_dim = saved["models"]["gemma3"].config.head_dim

    def base_of(inv_freq: torch.Tensor, dim: int) -> float:  # inv_freq[1] = base^(-2/dim), unscaled
        return float(inv_freq[1].double() ** (-dim / 2))

    bare_global = got["gemma3_bare"]["rotary"]["full_attention"][0]
    assert base_of(bare_global, head_dim) == pytest.approx(1e6, rel=1e-4)  # 4.x's Gemma 3 default: not trained
    assert base_of(got["gemma3_bare"]["rotary"]["sliding_attention"][0], head_dim) == pytest.approx(1e4, rel=1e-4)
    before, after = got["hold_before"]["rotary"], got["hold_after"]["rotary"]
    assert base_of(before["full_attention"][0], 256) == pytest.approx(1e6, rel=1e-4)
    assert base_of(after["full_attention"][0], 256) == pytest.approx(2e7, rel=1e-4)
    assert base_of(after["sliding_attention"][0], 256) == pytest.approx(1e4, rel=1e-4)
    want = rope_probe.probe(str(saved["hold"]["before"]), overrides=SMALL)["rotary"]  # 5.x, the file as written
    for layer_type, (inv_freq, _) in want.items():
        torch.testing.assert_close(after[layer_type][0], inv_freq, rtol=1e-6, atol=0)


def test_the_scripted_writers_save_through_the_hook():
    """The writers that are programs in a string or a shell script (the pipeline's miniature, the 1M recipe's final
    config) call save_model too; train.py's writer is checked above, fetch's (convert_gguf) in test_gguf.py."""
    from easy_context.extend import pipeline

    assert "save_model(model, out)" in pipeline.MICRO_MODEL_SCRIPT
    assert ".save_pretrained(" not in pipeline.MICRO_MODEL_SCRIPT
    assert "save_model(c, sys.argv[1])" in (ROOT / "train_scripts" / "EasyContext-1M-Llama-2-7B.sh").read_text()
