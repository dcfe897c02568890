"""GGUF files (llama.cpp checkpoints) as a model source: ``--model path/model.gguf`` (or a folder holding one .gguf).

transformers reads a GGUF (``from_pretrained(folder, gguf_file=name)``, with the ``gguf`` package installed) and
keeps it marked as quantized (``config.quantization_config``, ``quant_method: gguf``): such a model cannot be saved
and is not meant for training. Here it is loaded dequantized into a plain model in the requested dtype, with no
quantization marks, so it trains, and ``save_pretrained`` writes an ordinary HF folder (safetensors + config.json)
that loads without ``gguf``. Problems with the file (package missing, truncated, an architecture or a quantization
type transformers cannot read, no tokenizer inside) are one-line errors that say what to do.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import NamedTuple

import torch

from easy_context.models.gguf_rope import apply_rope_metadata

GGUF_MAGIC = b"GGUF"
INSTALL_HINT = "pip install 'easy_context[gguf]' (or: pip install gguf)"
_NOT_ARCHITECTURES = {"general", "tokenizer"}  # keys of transformers' GGUF config table that name no architecture


class GGUFInfo(NamedTuple):
    """What :func:`check_gguf` read from a file's header."""

    architecture: str
    tensor_types: tuple[str, ...]  # ggml types of the tensors (F32, Q8_0, Q4_K, ...), sorted
    has_tokenizer: bool  # tokenizer.ggml.model and tokenizer.ggml.tokens are present
    special_ids: tuple[tuple[str, int], ...] = ()  # ("bos_token", 1), ...: tokenizer.ggml.*_token_id as written


def is_gguf(name: str) -> bool:
    """Whether ``name`` names a GGUF checkpoint: a path ending in ``.gguf``, or a folder holding exactly one ``.gguf``
    file and no config.json."""
    if not name:
        return False
    path = os.path.expanduser(name)
    if path.lower().endswith(".gguf"):
        return True
    return os.path.isdir(path) and not os.path.exists(os.path.join(path, "config.json")) and len(_ggufs(path)) == 1


def split_gguf(name: str) -> tuple[str, str]:
    """``(folder, filename)`` of a GGUF name, as ``from_pretrained(folder, gguf_file=filename)`` takes them."""
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        found = _ggufs(path)
        if len(found) != 1:
            raise ValueError(f"{name}: a folder with {len(found)} .gguf files; name one (e.g. {name}/MODEL.gguf)")
        return path, found[0]
    if not path.lower().endswith(".gguf"):
        raise ValueError(f"{name}: not a GGUF file name (a path ending in .gguf)")
    folder, filename = os.path.split(os.path.abspath(path))
    return folder, filename


def gguf_file(name: str) -> str:
    """The path of the .gguf file a GGUF name (file or folder) stands for."""
    return os.path.join(*split_gguf(name))


def require_gguf():
    """The ``gguf`` package, or a RuntimeError naming the install command (transformers reads GGUF through it)."""
    try:
        import gguf
    except ImportError as e:
        raise RuntimeError(f"reading a GGUF file needs the gguf package: {INSTALL_HINT}") from e
    return gguf


def supported_architectures() -> list[str]:
    """The ``general.architecture`` values transformers loads from GGUF (its tables, so it follows the version)."""
    names: set[str] = set()
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        names.update(GGUF_SUPPORTED_ARCHITECTURES)
    except ImportError:
        pass
    try:  # transformers >= 5.2x: architectures read without the gguf package (qwen35, lfm2, ...)
        from transformers.integrations.gguf import GGUF_ARCHS

        names.update(GGUF_ARCHS)
    except ImportError:
        pass
    return sorted(names - _NOT_ARCHITECTURES)


@functools.cache
def dequantizable_types() -> tuple[str, ...]:
    """The ggml tensor types ``gguf`` can dequantize (what transformers uses to unpack the weights), by trying one
    block of each: F32, F16, BF16, Q8_0, Q4_K, ..."""
    import numpy as np

    gguf = require_gguf()
    names = []
    for qtype, (_, type_size) in gguf.GGML_QUANT_SIZES.items():
        try:
            gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
        except Exception:  # NotImplementedError: no dequantization for this type
            continue
        names.append(qtype.name)
    return tuple(names)


def check_gguf(name: str) -> GGUFInfo:
    """Read and check a GGUF file's header and tensor table (cached per file version). Raises a one-line
    RuntimeError (``gguf`` missing) or ValueError (no such file, not a GGUF, truncated or corrupt, a quantization
    type that cannot be dequantized), starting with ``name``."""
    path = gguf_file(name)
    if not os.path.isfile(path):
        raise ValueError(f"{name}: no such GGUF file")
    stat = os.stat(path)
    try:
        return _check(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    except (RuntimeError, ValueError) as e:
        raise type(e)(f"{name}: {e}") from e


def gguf_error(name: str) -> str | None:
    """:func:`check_gguf`'s error message, or None when the file is usable."""
    try:
        check_gguf(name)
    except (RuntimeError, ValueError) as e:
        return str(e)
    return None


@functools.lru_cache(maxsize=16)
def _check(path: str, size: int, mtime_ns: int) -> GGUFInfo:
    with open(path, "rb") as f:
        head = f.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        lfs = " (a git-lfs pointer: run git lfs pull)" if head == b"vers" else ""
        raise ValueError(f"not a GGUF file (starts with {head!r}, not b'GGUF'){lfs}")
    gguf = require_gguf()
    try:
        reader = gguf.GGUFReader(path)
        end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    except Exception as e:  # numpy view/reshape errors where the file stops early
        raise ValueError(f"truncated or corrupt GGUF file ({type(e).__name__}: {e}); download it again") from e
    if end > size:
        raise ValueError(f"truncated GGUF file ({size} bytes, its tensors end at {end}); download it again")
    field = reader.fields.get("general.architecture")
    architecture = str(field.contents()) if field is not None else "?"
    types = tuple(sorted({t.tensor_type.name for t in reader.tensors}))
    bad = [t for t in types if t not in dequantizable_types()]
    if bad:
        raise ValueError(
            f"tensors of type {', '.join(bad)}, which gguf {_version(gguf)} cannot dequantize; use a file "
            f"quantized as one of {', '.join(dequantizable_types())} (e.g. F16, BF16, Q8_0, Q4_K_M)"
        )
    has_tokenizer = "tokenizer.ggml.model" in reader.fields and "tokenizer.ggml.tokens" in reader.fields
    special = []
    for attr, key in _SPECIAL_FIELDS:
        field = reader.fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            special.append((attr, int(field.contents())))
    return GGUFInfo(architecture, types, has_tokenizer, tuple(special))


# the tokenizer's special tokens and the GGUF fields (tokenizer.ggml.<key>) that name their ids
_SPECIAL_FIELDS = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
                   ("pad_token", "padding_token_id"))  # fmt: skip


def load_gguf_config(name: str):
    """The transformers config of a GGUF file (no ``quantization_config``): what ``easy_context.models.build_config``
    starts from before its overrides (RoPE base, scaling, context size)."""
    from transformers import AutoConfig

    info = check_gguf(name)
    folder, filename = split_gguf(name)
    with _explain(name, info):
        config = AutoConfig.from_pretrained(folder, gguf_file=filename)
    _drop_quantization_config(config)
    # transformers reads rope.freq_base only; the sliding layers' base and the scaling are in the file too
    apply_rope_metadata(config, read_rope_fields(gguf_file(name), info.architecture))
    return config


def read_rope_fields(path: str, architecture: str) -> dict:
    """The ``{architecture}.rope.*`` fields of a GGUF file, keys without the prefix (``rope.freq_base``, ...)."""
    reader = require_gguf().GGUFReader(path)
    prefix = f"{architecture}."
    return {k[len(prefix) :]: f.contents() for k, f in reader.fields.items() if k.startswith(prefix + "rope.")}


def load_gguf_model(name: str, dtype: torch.dtype = torch.bfloat16, *, config=None):
    """A plain (not quantized) causal LM from a GGUF file, every weight dequantized to ``dtype``.

    ``config``: the model's config (``easy_context.models.build_config`` applies the RoPE base, scaling and context
    size to :func:`load_gguf_config`'s); None: the file's own. The result has no ``quantization_config`` and no
    quantizer: it trains, and ``save_pretrained`` writes a plain folder."""
    from transformers import AutoModelForCausalLM

    if config is None:
        config = load_gguf_config(name)
    info = check_gguf(name)
    folder, filename = split_gguf(name)
    extra = {}
    try:  # transformers >= 5.2x: ask for dense weights (else a kernel may keep some packed in ggml blocks)
        from transformers import GgufConfig

        extra["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    with _explain(name, info):
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, config=config, dtype=dtype, **extra)
    if "hf_quantizer" in vars(model):
        del model.hf_quantizer
    _drop_quantization_config(model.config)
    return model


def load_gguf_tokenizer(name: str):
    """The tokenizer stored in a GGUF file's metadata (``tokenizer.ggml.*``), as a transformers fast tokenizer: Gemma's
    rebuilt here (:mod:`easy_context.models.gguf_tokenizer`), the others converted by transformers."""
    from transformers import AutoTokenizer

    from easy_context.models.gguf_tokenizer import build_gemma_tokenizer, needs_own_tokenizer

    info = check_gguf(name)
    if not info.has_tokenizer:
        raise ValueError(
            f"{name}: the GGUF file holds no tokenizer (no tokenizer.ggml.* metadata); pass --tokenizer DIR "
            "(a tokenizer folder or hub id, e.g. the original model's)"
        )
    folder, filename = split_gguf(name)
    fields = read_tokenizer_fields(gguf_file(name))
    if needs_own_tokenizer(fields, info.architecture):  # transformers' conversion of these depends on its version
        return build_gemma_tokenizer(fields)
    with _explain(name, info):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    # the file's own special-token ids win (transformers 5.17 read SmolLM2's eos as its bos, <|im_start|>)
    for attr, token_id in info.special_ids:
        if 0 <= token_id < len(tokenizer) and getattr(tokenizer, f"{attr}_id", None) != token_id:
            setattr(tokenizer, attr, tokenizer.convert_ids_to_tokens(token_id))
    return tokenizer


def read_tokenizer_fields(path: str) -> dict:
    """Every ``tokenizer.*`` field of a GGUF file (``tokenizer.ggml.*``, ``tokenizer.chat_template``) as plain
    Python values."""
    reader = require_gguf().GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}


def _ggufs(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.lower().endswith(".gguf"))


def _drop_quantization_config(config) -> None:
    """Remove ``quantization_config`` (transformers would otherwise save it, and reload the folder as GGUF)."""
    if "quantization_config" in vars(config):
        del config.quantization_config


def _version(module) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module.__name__)
    except PackageNotFoundError:
        return "(unknown version)"


@contextlib.contextmanager
def _explain(name: str, info: GGUFInfo):
    """Turn transformers' errors for a GGUF it cannot read into one line naming what works."""
    try:
        yield
    except (ValueError, KeyError, NotImplementedError) as error:
        text, arch = str(error), info.architecture
        if "is not supported yet" in text or "Cannot rebuild a config" in text:
            import transformers

            raise ValueError(
                f"{name}: architecture {arch!r} cannot be loaded from GGUF by transformers {transformers.__version__}; "
                f"it loads {', '.join(supported_architectures())} (or pass the original checkpoint's hub id / folder)"
            ) from error
        if "Unrecognized configuration class" in text:
            raise ValueError(
                f"{name}: architecture {arch!r} is not a causal LM (AutoModelForCausalLM cannot build it)"
            ) from error
        raise
