"""One name for a model everywhere (easy_context.models.resolve): plan, extend, train.py, the eval scripts and
bench/train_step.py take the same names (a fetch name, ``shape:<name>`` and the bare published name, a preset, a
config folder, its config.json) and read the same config from each; a fetch name not fetched yet is the same
one-line error naming the fetch command wherever a model is loaded, and once fetched it loads its folder."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from easy_context.extend import cli as extend_cli
from easy_context.extend.derive import model_config as extend_config
from easy_context.models import load_model, load_tokenizer, model_source_error
from easy_context.models.config_compat import save_model
from easy_context.models.fetch import find_source
from easy_context.models.shapes import BUILTIN_MODELS, PRESETS, ModelShape
from easy_context.plan import cli as plan_cli
from tests.support.gguf_writer import train_tokenizer
from tests.support.models import tiny_model

ROOT = Path(__file__).resolve().parents[2]
FETCH = "gemma3-270m"
CONFIG = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
NAMES = [FETCH, "shape:llama-3-8b", "llama-3-8b", "tiny-llama", "config-folder", "config-file"]


def _train_step():
    """bench/train_step.py as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("train_step", ROOT / "bench" / "train_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def place(tmp_path, monkeypatch) -> Path:
    """An empty working dir (fetch names resolve to models/... under it) holding a config-only folder."""
    monkeypatch.chdir(tmp_path)
    values = dict(CONFIG)
    LlamaConfig(**{k: v for k, v in values.items() if k != "model_type"}).save_pretrained(tmp_path / "shape")
    return tmp_path


def spec_of(name: str, place: Path) -> str:
    return {"config-folder": str(place / "shape"), "config-file": str(place / "shape" / "config.json")}.get(name, name)


def reference(name: str) -> dict:
    """The config each name stands for, from its own table (not through the resolver)."""
    if name == FETCH:
        return dict(find_source(FETCH).config)
    if name in PRESETS:
        model_type, values = PRESETS[name]
        return dict(values, model_type=model_type, vocab_size=32000)
    if name.startswith("config"):
        return dict(CONFIG)
    return dict(BUILTIN_MODELS["llama-3-8b"])


@pytest.mark.parametrize("name", NAMES)
def test_plan_and_extend_read_the_same_config(name, place, capsys):
    spec = spec_of(name, place)
    assert plan_cli.main(["--model", spec, "--gpus", "1", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["model"]
    want = ModelShape.from_config(name, reference(name))
    assert (planned["params"], planned["layers"], planned["hidden"]) == (want.params, want.layers, want.hidden)
    config = extend_config(spec)
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (
        want.hidden, want.layers, want.kv_heads)  # fmt: skip


def test_extend_and_plan_take_a_fetch_name_before_it_is_fetched(place, capsys):
    """The issue's case: plan answered ``unknown model 'gemma3-270m'`` where extend derived a recipe."""
    assert plan_cli.main(["--model", FETCH, "--gpus", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"{FETCH}: 0.27B params")
    recipe = place / "r.yaml"
    assert extend_cli.main(["--model", FETCH, "--to", "64K", "--dry-run", "--write-recipe", str(recipe)]) == 0
    assert "gemma3_270m_64K" in capsys.readouterr().out and recipe.is_file()


@pytest.mark.parametrize("name", NAMES)
def test_loading_commands_take_the_same_names(name, place, capsys):
    """train.py, eval_needle.py and bench/train_step.py accept every name, except a fetch name not fetched yet: that
    is one line naming the fetch command, the same in each."""
    from easy_context.eval import run_needle
    from easy_context.training import flags

    spec = spec_of(name, place)
    train = ["--model", spec, "--dataset", "random:4", "--vocab-size", "64", "--output-dir", str(place / "out")]
    needle = ["--model", spec, "--tokenizer", str(place)]
    hint = f"--model {FETCH}: not fetched yet (models/gemma-3-270m holds no model); fix: easy-context-fetch {FETCH}"
    if name != FETCH:
        assert flags.parse_args(train).model == spec and run_needle.parse_args(needle).model == spec
        assert model_source_error(spec) is None
        _train_step().check_model(spec)
        return
    assert model_source_error(spec).startswith(hint)
    for parse, argv in ((flags.parse_args, train), (run_needle.parse_args, needle)):
        with pytest.raises(SystemExit):
            parse(argv)
        assert hint in capsys.readouterr().err
    with pytest.raises(SystemExit, match="easy-context-fetch gemma3-270m"):
        _train_step().check_model(spec)
    with pytest.raises(ValueError, match="easy-context-fetch gemma3-270m"):
        load_model(spec)


def test_a_fetched_name_is_its_folder_everywhere(place, capsys, monkeypatch):
    """Once fetch wrote models/gemma-3-270m (here: a tiny Gemma 3 and a tokenizer, the source's shipped config made
    that shape: a folder of another shape is another model, never the name's), the name loads that folder's weights
    and tokenizer, and plan reads that folder's config."""
    import dataclasses

    from easy_context.models import catalog
    from easy_context.training import flags

    folder = place / find_source(FETCH).default_dest
    model = tiny_model("gemma3_text", seed=4)
    shape = {k: v for k, v in model.config.to_dict().items() if k in catalog.SHAPE_KEYS}
    source = dataclasses.replace(find_source(FETCH), config={**find_source(FETCH).config, **shape})
    monkeypatch.setattr(catalog, "SOURCES", tuple(source if s.name == FETCH else s for s in catalog.SOURCES))
    save_model(model, folder)
    tokenizer = train_tokenizer(folder)
    loaded = load_model(FETCH, dtype=torch.float32)
    ids = torch.arange(24)[None] % model.config.vocab_size
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(ids).logits
        torch.testing.assert_close(loaded(ids).logits, want, rtol=0, atol=0)
    assert load_tokenizer(FETCH)("the model").input_ids == tokenizer("the model").input_ids
    assert model_source_error(FETCH) is None
    assert flags.parse_args(["--model", FETCH, "--dataset", "random:4", "--output-dir", "out"]).model == FETCH
    capsys.readouterr()
    assert plan_cli.main(["--model", FETCH, "--gpus", "1", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["model"]
    assert (planned["hidden"], planned["layers"]) == (model.config.hidden_size, model.config.num_hidden_layers)
