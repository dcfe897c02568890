"""easy_context.export: an HF folder (tiny Llama, tiny Gemma 3) exported as GGUF is read back by transformers' own
GGUF loader (an implementation other than ours) to the same tensors and logits; the metadata carries the trained
context length, RoPE bases and scaling; GGUF -> HF -> export -> HF gives the same tensors; one-line errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from tests.support.gguf_writer import tiny_llama, train_tokenizer, write_tiny_llama_gguf

gguf = pytest.importorskip("gguf")

TEXTS = ["the model reads a long context", "where each word comes from, Über 123 in the text!"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def save(model, tok, folder) -> str:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def tiny_gemma3(tok, full_theta: float = 4e6, sliding_theta: float = 1e4, seed: int = 0, vocab_size: int | None = None):
    """A random float32 Gemma3ForCausalLM: 6 layers (5 sliding of window 16, 1 global), head_dim 256 (transformers'
    GGUF loader assumes query_pre_attn_scalar 256), random norms (a +1 offset gone wrong shows in the logits)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=vocab_size or len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=16,
        max_position_embeddings=1024, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    config.rope_parameters["full_attention"]["rope_theta"] = full_theta
    config.rope_parameters["sliding_attention"]["rope_theta"] = sliding_theta
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
    return model


def logits(model, n: int = 48) -> torch.Tensor:
    ids = torch.arange(n)[None] * 7 % model.config.vocab_size
    with torch.no_grad():
        return model(ids).logits.float()


def transformers_gguf(path):
    """The model and tokenizer transformers' own GGUF loader reads from ``path`` (float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    return (AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32),
            AutoTokenizer.from_pretrained(folder, gguf_file=name))  # fmt: skip


def fields(path) -> dict:
    return {k: f.contents() for k, f in gguf.GGUFReader(str(path)).fields.items()}


def gguf_tensors(path) -> dict[str, np.ndarray]:
    from gguf.quants import dequantize

    return {t.name: dequantize(t.data, t.tensor_type) for t in gguf.GGUFReader(str(path)).tensors}


def assert_same_tensors(reference, model, tol: float) -> None:
    ref, got = reference.state_dict(), model.state_dict()
    assert set(ref) == set(got)
    for name, value in ref.items():
        torch.testing.assert_close(got[name].float(), value.float(), atol=tol, rtol=tol, msg=name)


@pytest.mark.parametrize("kind, tol", [("f32", 0.0), ("f16", 1e-3), ("bf16", 8e-3), ("q8_0", 2e-2)])
def test_llama_export_reads_back_in_transformers(tok, tmp_path, kind, tol):
    from easy_context.export.gguf import export_gguf

    model = tiny_llama(tok, rope_theta=5e5, max_position_embeddings=2048)
    out = tmp_path / f"tiny-{kind}.gguf"
    info = export_gguf(save(model, tok, tmp_path / "hf"), str(out), kind)
    assert (info["arch"], info["vocab"], info["tensors"]) == ("llama", "hf", 2 + 9 * 2)  # tied: no output.weight
    meta = fields(out)
    assert meta["llama.context_length"] == 2048 and meta["llama.rope.freq_base"] == 5e5
    assert meta["general.file_type"] == int(
        getattr(gguf.LlamaFileType, {"f32": "ALL_F32"}.get(kind, f"MOSTLY_{kind.upper()}"))
    )
    loaded, loaded_tok = transformers_gguf(out)
    assert loaded.config.rope_parameters["rope_theta"] == 5e5 and loaded.config.max_position_embeddings == 2048
    assert_same_tensors(model, loaded, tol)
    ref = logits(model)
    err = (logits(loaded) - ref).abs().max().item()
    assert err <= max(tol, 1e-6) * 20 * ref.abs().max().item(), err
    assert [loaded_tok(t).input_ids for t in TEXTS] == [tok(t).input_ids for t in TEXTS]
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.0.attn_q.weight"] == kind.upper()


def test_qwen2_export_reads_back_in_transformers(tok, tmp_path):
    """Qwen2: q/k/v biases, no q/k permutation (llama.cpp's qwen2 rotates halves, as transformers does)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from easy_context.export.gguf import export_gguf

    rope = {"rope_type": "default", "rope_theta": 3e5}
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False, rope_parameters=rope)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    out = tmp_path / "qwen2.gguf"
    info = export_gguf(save(model, tok, tmp_path / "hf"), str(out), "f32")
    assert info["arch"] == "qwen2" and info["tensors"] == 3 + 12 * 2  # untied: output.weight too
    assert fields(out)["qwen2.rope.freq_base"] == 3e5 and "blk.0.attn_q.bias" in gguf_tensors(out)
    loaded, _ = transformers_gguf(out)
    assert_same_tensors(model, loaded, 0.0)
    torch.testing.assert_close(logits(loaded), logits(model), atol=1e-5, rtol=0)


def test_gemma3_export_reads_back_in_transformers(tok, tmp_path):
    """Gemma 3: norms stored as 1 + w (transformers subtracts 1 on load), both bases, window, head size."""
    from easy_context.export.gguf import export_gguf

    model = tiny_gemma3(tok)
    out = tmp_path / "gemma.gguf"
    info = export_gguf(save(model, tok, tmp_path / "hf"), str(out), "f32")
    meta = fields(out)
    assert meta["general.architecture"] == "gemma3" and info["tensors"] == 1 + 1 + 13 * 6
    assert meta["gemma3.rope.freq_base"] == 4e6 and meta["gemma3.rope.freq_base_swa"] == 1e4
    assert meta["gemma3.context_length"] == 1024 and meta["gemma3.attention.sliding_window"] == 16
    assert meta["gemma3.attention.key_length"] == 256
    raw = gguf_tensors(out)["blk.0.post_attention_norm.weight"]
    np.testing.assert_allclose(
        raw, model.model.layers[0].post_attention_layernorm.weight.detach().numpy() + 1, atol=1e-7
    )
    loaded, _ = transformers_gguf(out)
    assert loaded.config.rope_parameters["full_attention"]["rope_theta"] == 4e6
    assert_same_tensors(model, loaded, 1e-6)
    torch.testing.assert_close(logits(loaded), logits(model), atol=1e-5, rtol=0)
    bf16 = tmp_path / "gemma-bf16.gguf"
    export_gguf(str(tmp_path / "hf"), str(bf16), "bf16")
    err = (logits(transformers_gguf(bf16)[0]) - logits(model)).abs().max().item()
    assert 0 < err < 0.05 * logits(model).abs().max().item(), err


def test_yarn_scaling_and_the_sliding_base_reach_the_file_and_come_back(tok, tmp_path):
    """What transformers' loader drops (the sliding layers' base, the YaRN scaling) is in the file with llama.cpp's
    keys, and easy_context's GGUF import restores it: the same logits past the original length."""
    from easy_context.export.gguf import export_gguf
    from easy_context.models import load_model, set_rope_scaling

    model = tiny_llama(tok, rope_theta=2e5, max_position_embeddings=1024)
    set_rope_scaling(model.config, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256})
    model = type(model)(model.config).float().eval()  # rebuilt: the rotary frequencies of the scaled config
    out = tmp_path / "yarn.gguf"
    export_gguf(save(model, tok, tmp_path / "hf"), str(out), "f32")
    meta = fields(out)
    assert (meta["llama.rope.scaling.type"], meta["llama.rope.scaling.factor"]) == ("yarn", 4.0)
    assert meta["llama.rope.scaling.original_context_length"] == 256 and meta["llama.context_length"] == 1024
    back = load_model(str(out), dtype=torch.float32)
    params = back.config.rope_parameters
    assert (params["rope_type"], params["factor"], params["rope_theta"]) == ("yarn", 4.0, 2e5)
    assert params["original_max_position_embeddings"] == 256
    torch.testing.assert_close(logits(back, 400), logits(model, 400), atol=1e-5, rtol=0)

    gemma = tiny_gemma3(tok, full_theta=3e6, sliding_theta=2e4, seed=1)
    out = tmp_path / "gemma.gguf"
    export_gguf(save(gemma, tok, tmp_path / "gemma"), str(out), "f32")
    assert fields(out)["gemma3.rope.freq_base_swa"] == 2e4
    back = load_model(str(out), dtype=torch.float32)
    assert back.config.rope_parameters == gemma.config.rope_parameters
    torch.testing.assert_close(logits(back), logits(gemma), atol=1e-5, rtol=0)


def test_gguf_to_hf_to_gguf_keeps_tensors_metadata_and_the_source_tokenizer(tok, tmp_path):
    """A model fetched as GGUF (a Q8_0 source in DEST/gguf/, as easy-context-fetch leaves it), converted to HF, then
    "trained" (a run whose run_config.json names it), exports with the source's tokenizer fields copied and the same
    tensors; transformers reads the export to the HF folder's logits."""
    from transformers import AutoModelForCausalLM

    from easy_context.export.gguf import export_gguf
    from easy_context.models import convert_gguf

    tok.save_pretrained(tmp_path / "tok")
    source = write_tiny_llama_gguf(tmp_path / "src.gguf", tiny_llama(tok), tmp_path / "tok", quant="Q8_0")
    base = tmp_path / "base"
    (base / "gguf").mkdir(parents=True)
    shutil.copy(source, base / "gguf" / "src.gguf")
    convert_gguf(source, str(base), dtype=torch.float32)
    trained = tmp_path / "extended"
    shutil.copytree(base, trained, ignore=shutil.ignore_patterns("gguf"))
    (trained / "run_config.json").write_text(json.dumps({"args": {"model": str(base)}}))
    out = tmp_path / "out.gguf"
    info = export_gguf(str(trained), str(out), "f32")
    assert info["vocab"] == f"gguf:{base / 'gguf' / 'src.gguf'}"
    src, got = fields(source), fields(out)
    assert {k: v for k, v in got.items() if k.startswith("tokenizer.")} == {
        k: v for k, v in src.items() if k.startswith("tokenizer.")
    }
    a, b = gguf_tensors(source), gguf_tensors(out)
    assert set(a) == set(b) and all(np.array_equal(a[k].reshape(b[k].shape), b[k]) for k in a)
    hf = AutoModelForCausalLM.from_pretrained(trained, dtype=torch.float32)
    loaded, loaded_tok = transformers_gguf(out)
    assert_same_tensors(hf, loaded, 0.0)
    torch.testing.assert_close(logits(loaded), logits(hf), atol=0, rtol=0)
    assert [loaded_tok(t).input_ids for t in TEXTS] == [tok(t).input_ids for t in TEXTS]
    # the export converted back to HF is the folder it came from
    again = convert_gguf(str(out), str(tmp_path / "again"), dtype=torch.float32)
    assert_same_tensors(hf, AutoModelForCausalLM.from_pretrained(again, dtype=torch.float32), 0.0)


def test_a_gemma_sentencepiece_vocabulary_is_copied_from_its_source(tok, tmp_path):
    """A Gemma GGUF's SentencePiece vocabulary (tokenizer.ggml.model llama: pieces, float scores, token types, no
    merges), which no HF tokenizer.json reproduces, is copied field for field (--vocab-from); the export's tokenizer
    cuts text as the source's does."""
    from easy_context.export.gguf import export_gguf
    from easy_context.models.gguf import load_gguf_tokenizer
    from tests.support.gemma_gguf import essays, train_pieces, write_gemma_gguf

    _, pieces = train_pieces(essays(40_000), vocab_size=400)
    source = write_gemma_gguf(tmp_path / "gemma-tok.gguf", pieces)
    model = tiny_gemma3(tok, vocab_size=len(pieces))
    out = tmp_path / "out.gguf"
    info = export_gguf(save(model, tok, tmp_path / "hf"), str(out), "bf16", vocab_from=source)
    assert info["vocab"] == f"gguf:{source}"
    src, got = fields(source), fields(out)
    vocab = {k: v for k, v in src.items() if k.startswith("tokenizer.")}
    assert vocab and {k: v for k, v in got.items() if k.startswith("tokenizer.")} == vocab
    assert gguf.GGUFReader(str(out)).fields["tokenizer.ggml.scores"].types[-1] == gguf.GGUFValueType.FLOAT32
    a, b = load_gguf_tokenizer(source), load_gguf_tokenizer(str(out))
    for text in TEXTS:
        assert b(text).input_ids == a(text).input_ids
    other = save(tiny_gemma3(tok), tok, tmp_path / "hf300")  # the 300-token BPE's model: not this vocabulary
    with pytest.raises(ValueError, match=rf"--vocab-from {source}: {len(pieces)} tokens, the model has vocab_size 300"):
        export_gguf(other, str(tmp_path / "x.gguf"), vocab_from=source)


def test_cli_and_one_line_errors(tok, tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    from easy_context.export.cli import main
    from easy_context.models import set_rope_scaling

    folder = save(tiny_llama(tok), tok, tmp_path / "hf")
    assert main([folder, "--gguf", str(tmp_path / "x.gguf"), "--type", "q8_0"]) == 0
    printed = capsys.readouterr().out
    assert (
        printed.startswith(f"wrote {tmp_path / 'x.gguf'} (llama, q8_0, 20 tensors")
        and "rope.freq_base=10000" in printed
    )

    def error(*argv) -> str:
        with pytest.raises(SystemExit) as e:
            main([*argv, "--gguf", str(tmp_path / "bad.gguf")])
        return str(e.value)

    assert (
        error(str(tmp_path))
        == f"error: {tmp_path}: no config.json (an HF model folder, e.g. the pipeline's WORK/extended)"
    )
    gpt2 = save(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tok))), tok, tmp_path / "g")
    assert error(gpt2).startswith("error: model_type 'gpt2' cannot be exported to GGUF here; exportable: llama, qwen2")
    dynamic = tiny_llama(tok)
    set_rope_scaling(dynamic.config, {"rope_type": "dynamic", "factor": 4.0})
    msg = error(save(dynamic, tok, tmp_path / "dyn"))
    assert msg.startswith("error: RoPE scaling 'dynamic' has no GGUF form llama.cpp reads"), msg
    msg = error(folder, "--vocab-from", str(tmp_path / "x.gguf").replace("x.gguf", "none.gguf"))
    assert msg == f"error: --vocab-from {tmp_path / 'none.gguf'}: no such GGUF file"
