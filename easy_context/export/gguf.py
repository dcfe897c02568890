"""An HF model folder (an extended model) as one GGUF file llama.cpp / ollama run.

    easy-context-export MODEL_DIR --gguf OUT.gguf [--type f16|bf16|q8_0|f32] [--vocab-from auto|hf|FILE.gguf]

The weights are read from the folder's safetensors, renamed to llama.cpp's tensor names (``gguf``'s own name table),
and laid out as llama.cpp expects them: Llama's q/k rows in its rotary order, Gemma 3's norm weights as 1 + w. 1-D
tensors (norms, biases) stay F32, as llama.cpp's converter writes them; with ``q8_0`` a matrix whose rows are not
whole 32-value blocks is written F16. The metadata carries what the training changed: ``context_length`` =
``max_position_embeddings`` (the trained length), the RoPE base(s) and scaling read from ``rope_parameters``
(:mod:`easy_context.models.gguf_rope`), and the tokenizer (:mod:`easy_context.export.vocab`).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator

import numpy as np

from easy_context.export.families import family, hyperparameters, permute_rows
from easy_context.export.vocab import vocab_fields
from easy_context.models.gguf import require_gguf
from easy_context.models.gguf_rope import rope_metadata

TYPES = ("f16", "bf16", "q8_0", "f32")
Q8_BLOCK = 32


def _tensors(model_dir: str) -> Iterator[tuple[str, np.ndarray]]:
    """(name, float32 array) of every tensor in the folder's safetensors files."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors weights (a folder written by save_pretrained is needed)")
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name).float().numpy()


def _encode(w: np.ndarray, kind: str):
    """(data, raw ggml type or None) of one tensor in the export type ``kind``."""
    gguf = require_gguf()
    qtype = gguf.GGMLQuantizationType
    if w.ndim == 1 or kind == "f32":
        return w.astype(np.float32), None
    if kind == "f16" or (kind == "q8_0" and w.shape[-1] % Q8_BLOCK):
        return w.astype(np.float16), None
    target = qtype.BF16 if kind == "bf16" else qtype.Q8_0
    return gguf.quants.quantize(np.ascontiguousarray(w), target), target


def _file_type(kind: str) -> int:
    ftype = require_gguf().LlamaFileType
    return int({"f32": ftype.ALL_F32, "f16": ftype.MOSTLY_F16, "bf16": ftype.MOSTLY_BF16,
                "q8_0": ftype.MOSTLY_Q8_0}[kind])  # fmt: skip


def _add(writer, key: str, value) -> None:
    """One metadata field, typed as llama.cpp reads it (counts uint32, real numbers float32)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    else:
        writer.add_string(key, value)


def export_gguf(model_dir: str, out: str, kind: str = "f16", vocab_from: str = "auto", name: str | None = None) -> dict:
    """Write ``model_dir`` as the GGUF file ``out``; returns what was written: ``arch``, ``type``, ``tensors``,
    ``vocab`` (the tokenizer's route), ``metadata`` (the ``{arch}.*`` fields). Errors are one-line ValueErrors."""
    from transformers import AutoConfig

    gguf = require_gguf()
    if kind not in TYPES:
        raise ValueError(f"--type {kind}: one of {', '.join(TYPES)}")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"{model_dir}: no config.json (an HF model folder, e.g. the pipeline's WORK/extended)")
    config = AutoConfig.from_pretrained(model_dir)
    fam = family(config)
    metadata = {**hyperparameters(config), **rope_metadata(config)}
    route, vocab = vocab_fields(model_dir, int(config.vocab_size), vocab_from)
    name_map = gguf.get_tensor_name_map(
        next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == fam.arch), config.num_hidden_layers
    )
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    writer = gguf.GGUFWriter(out, fam.arch)
    writer.add_name(name or os.path.basename(os.path.normpath(model_dir)))
    writer.add_file_type(_file_type(kind))
    for key, value in metadata.items():
        _add(writer, f"{fam.arch}.{key}", value)
    for key, value, vtype, sub in vocab:
        writer.add_key_value(key, value, vtype, sub_type=sub)
    count = 0
    for hf_name, w in _tensors(model_dir):
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp reuses token_embd when there is no output.weight
        gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"{model_dir}: tensor {hf_name} has no llama.cpp name for {fam.arch}; cannot export it")
        if fam.permute_qk and ".attn_q." in gguf_name:
            w = permute_rows(w, config.num_attention_heads)
        elif fam.permute_qk and ".attn_k." in gguf_name:
            w = permute_rows(w, config.num_key_value_heads)
        if fam.norm_offset and hf_name.endswith("norm.weight"):
            w = w + np.float32(fam.norm_offset)
        data, raw = _encode(w, kind)
        writer.add_tensor(gguf_name, data, raw_dtype=raw)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"arch": fam.arch, "type": kind, "tensors": count, "vocab": route, "metadata": metadata}
