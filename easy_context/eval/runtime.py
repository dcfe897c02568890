"""Where an eval runs: the process group (one process or launched), the SP backend, the model and its limits.

One process: a 1-process gloo group (``HashStore``) so the SP code runs unchanged. Launched with
``accelerate launch`` / ``torchrun``: every process joins the world; with a distributed backend the world is
one SP group (all ranks share each sequence); with ``data_parallel`` each rank takes a share of the work.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from easy_context import cli
from easy_context.core import registry
from easy_context.core.groups import launch_error
from easy_context.core.registry import add_backend_args
from easy_context.sp_config import SPConfig, resolve_sp_config

DEFAULT_SP_MODE = "zigzag_ring_attn"


def default_parallel_mode(world_size: int) -> str:
    """zigzag ring attention when several processes share a sequence; the plain model on one process."""
    return DEFAULT_SP_MODE if world_size > 1 else "data_parallel"


@dataclass
class EvalRuntime:
    """This process's place in the eval: its SP setup (backend, options, kernel; the world is one SP group), device
    and accelerator."""

    sp: SPConfig
    device: torch.device
    accelerator: Any = None

    @property
    def rank(self) -> int:
        return self.sp.sp_rank

    @property
    def world_size(self) -> int:
        return self.sp.sp_size

    @property
    def seq_algo(self) -> str:
        return self.sp.backend

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.sp.options)

    @property
    def distributed(self) -> bool:
        """True when the ranks share each sequence (an SP backend); False for data parallel."""
        return self.sp.distributed

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def my_share(self, n: int) -> list[int]:
        """Indices of ``n`` work items this rank computes: all of them under SP, every W-th under data parallel."""
        if self.distributed:
            return list(range(n))
        return list(range(self.rank, n, self.world_size))

    def gather_objects(self, items: list) -> list:
        """Under data parallel, every rank's ``items`` concatenated (rank order); under SP, ``items`` unchanged."""
        if self.distributed or self.world_size == 1:
            return items
        parts: list[list | None] = [None] * self.world_size
        dist.all_gather_object(parts, items)
        return [item for part in parts for item in part]

    def print(self, *args, **kwargs) -> None:
        """``print`` on the main process only (to stderr unless ``file`` is given)."""
        if self.is_main:
            kwargs.setdefault("file", sys.stderr)
            print(*args, **kwargs, flush=True)


def _make_accelerator():
    """An Accelerator that owns the process group when launched (gloo on CPU, nccl on CUDA), as train.py does."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, InitProcessGroupKwargs

    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    backend = "nccl" if torch.cuda.is_available() else "gloo"  # gloo on CPU: else every rank thinks it is rank 0
    handlers = [InitProcessGroupKwargs(backend=backend, timeout=datetime.timedelta(minutes=60))] if launched else []
    accelerator = Accelerator(kwargs_handlers=handlers)
    error = launch_error(accelerator.distributed_type != DistributedType.NO)
    if error:
        raise RuntimeError(error)
    if not dist.is_initialized():  # one process: a process group of one, so SP code runs unchanged
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return accelerator


def init_runtime(parallel_mode: str | None, kernel: str = "auto", **options) -> EvalRuntime:
    """Join (or create) the process group and resolve the SP setup over the world (``parallel_mode`` None:
    :func:`default_parallel_mode`).

    ``options``: backend option flags (None: not given), e.g. ``registry.option_values(args)`` of the parsed
    :func:`add_runtime_args`; a flag given to a backend that does not take it raises ``ValueError``."""
    accelerator = _make_accelerator()
    backend = parallel_mode or default_parallel_mode(dist.get_world_size())
    return EvalRuntime(resolve_sp_config(backend, kernel=kernel, **options), accelerator.device, accelerator)


def check_layout(runtime: EvalRuntime, config) -> None:
    """Raise ValueError, naming the fix, for heads the backend cannot split over the ranks (the backend decides)."""
    runtime.sp.check_model(config)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 elsewhere; else the named torch dtype."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def load_eval_model(
    name: str,
    runtime: EvalRuntime,
    vocab_size: int,
    dtype: torch.dtype,
    rope_theta: float | None = None,
    seed: int = 0,
    rope_scaling: dict | None = None,
):
    """A causal LM ready for no-grad SP evaluation: on the device (or ZeRO-3 sharded), eval mode, backend patched.

    ``name`` is a hub id, a local checkpoint, or a preset of :mod:`easy_context.models` (random weights: an
    untrained baseline). The LM head is already :class:`~easy_context.loss.LMHeadWithLoss` (logits without
    targets, the loss with them), so ``CausalLMWithLoss(model)`` wraps it as is. Under an accelerate DeepSpeed
    config the model is prepared by accelerate (ZeRO-3 parameter sharding for models that do not fit one device).
    """
    from easy_context.models import load_model
    from easy_context.training.deepspeed_precision import deepspeed_precision_error

    error = deepspeed_precision_error(runtime.accelerator, dtype)  # ZeRO-3 would build the model in another dtype
    if error:
        raise ValueError(error)
    model = load_model(name, vocab_size=vocab_size, rope_theta=rope_theta, dtype=dtype, seed=seed,
                       rope_scaling=rope_scaling)  # fmt: skip
    model.config.use_cache = False
    check_layout(runtime, model.config)
    runtime.sp.attach(model)  # a named kernel also routes data_parallel through easy_context's kernels
    _install_loss_head(model)
    model.eval()
    accelerator = runtime.accelerator
    plugin = accelerator.state.deepspeed_plugin if accelerator is not None else None
    if plugin is not None:  # inference only: no optimizer/scheduler, one sequence per step
        config = plugin.deepspeed_config
        for key in ("optimizer", "scheduler"):
            config.pop(key, None)
        if not isinstance(config.get("train_micro_batch_size_per_gpu"), int):
            config["train_micro_batch_size_per_gpu"] = 1
        engine = accelerator.prepare(model)
        model = getattr(engine, "module", engine)
    else:
        model.to(runtime.device)
    return model


def _install_loss_head(model) -> None:
    """Swap in the loss-computing LM head before DeepSpeed wraps the model (its hooks must see the final modules).

    Under ZeRO-3 the weights are already partitioned at load (shape 0): gather the head's weight meanwhile.
    """
    from easy_context.loss import CausalLMWithLoss

    weight = model.get_output_embeddings().weight
    if hasattr(weight, "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([weight]):
            CausalLMWithLoss(model)
    else:
        CausalLMWithLoss(model)


def position_warning(config, length: int, model_name: str) -> str | None:
    """A warning when ``length`` tokens exceed the positions ``config``'s RoPE covers
    (:func:`~easy_context.models.rope_position_limit`), naming the RoPE base and scaling in use."""
    from easy_context.models import get_rope_theta, rope_position_limit

    limit, how = rope_position_limit(config)
    if not limit or length <= limit:
        return None
    return (
        f"warning: {length} tokens exceed the {limit} positions of {model_name} ({how}; rope_theta in use: "
        f"{get_rope_theta(config)}); positions beyond it measure extrapolation — train at this length, or pass a "
        "larger --rope_theta if the model was trained with one, or --rope_scaling (e.g. yarn:2) to scale at inference"
    )


def add_runtime_args(parser) -> None:
    """The flags both evals share: tokenizer, backend (its options, kernel), RoPE base, dtype, seed."""
    parser.add_argument("--tokenizer", default=None, help="defaults to the (first) --model; required for presets")
    add_backend_args(
        parser,
        default=None,
        mode_help=f"{', '.join(registry.SEQ_ALGOS)}; default {DEFAULT_SP_MODE} on several processes, "
        "data_parallel on one",
        kernel_help="local attention kernel (SP modes)",
    )
    parser.add_argument("--rope_theta", "--rope-theta", type=cli.positive_float, default=None,
                        help="override the RoPE base (Gemma 2/3: the global layers' only)")  # fmt: skip
    parser.add_argument("--rope_scaling", "--rope-scaling", default=None, metavar="TYPE:FACTOR[:ORIGINAL]",
                        help="training-free RoPE scaling, e.g. yarn:8, dynamic:8 (dynamic NTK), linear:4; ORIGINAL: "
                             "the trained length (default: the model's max_position_embeddings)")  # fmt: skip
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bfloat16 on CUDA, float32 on CPU",
    )
    parser.add_argument("--seed", type=int, default=0, help="needle numbers; weights of preset (random-init) models")


def load_eval_model_from_args(name: str, runtime: EvalRuntime, vocab_size: int, args, max_length: int | None = None):
    """:func:`load_eval_model` with the options :func:`add_runtime_args` defines (dtype, rope_theta, seed; the kernel
    is the runtime's). ``max_length``: the longest sequence the evaluation will run, refused up front
    (:func:`own_mask_error`) when the model's own attention cannot hold its mask."""
    from easy_context.models import parse_rope_scaling

    dtype = resolve_dtype(args.dtype, runtime.device)
    scaling = parse_rope_scaling(args.rope_scaling) if getattr(args, "rope_scaling", None) else None
    model = load_eval_model(name, runtime, vocab_size, dtype, args.rope_theta, args.seed, rope_scaling=scaling)
    error = None if max_length is None else own_mask_error(model.config, runtime, max_length)
    if error:
        raise ValueError(error)
    return model


def free_memory_bytes(device: torch.device) -> int:
    """What the device can still allocate: CUDA's free memory, or the host's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def own_mask_error(config, runtime: EvalRuntime, length: int, free_bytes: int | None = None) -> str | None:
    """Why ``length`` tokens cannot run through the model's own attention, or None. A model with sliding-window (or
    chunked) layers that attends with its own attention (data parallel with ``--kernel auto``) makes transformers
    build a (length x length) boolean mask for those layers; past about half the free memory it cannot, and the run
    would end in an out-of-memory error deep inside transformers. A named kernel routes the model through
    easy_context's attention, which cuts windows per block and builds no mask."""
    from easy_context.models import layer_windows

    if runtime.distributed or runtime.sp.kernel != "auto" or all(w is None for _, w in layer_windows(config)):
        return None
    need = length * length
    free = free_memory_bytes(runtime.device) if free_bytes is None else free_bytes
    if need <= free // 2:
        return None
    fix = "fa4 or flex on a GPU" if runtime.device.type == "cuda" else "cpu"
    return (f"{length} tokens through the model's own attention: its sliding-window layers need a {length} x "
            f"{length} mask ({need / 2**30:.1f} GiB; {free / 2**30:.1f} GiB free): pass --kernel ({fix}) to attend "
            "through easy_context's kernels, which build no mask")  # fmt: skip
