"""Checkpoints: resumable training state (accelerate) and the final HF checkpoint (safetensors).

Both are written atomically: into a hidden temp dir next to the target, fsynced, then renamed into place, so a
kill or a full disk never leaves a half-written checkpoint under the real name. A failed save removes its temp dir
and raises :class:`CheckpointError` (one line: the file, the cause, the last good checkpoint) on every rank; a run
that was killed mid-save leaves a temp dir that :func:`remove_stale_temp` clears on the next start. A state dir
records the size of each of its files, so a truncated or missing file (RNG states included) is refused on resume.

A state also records how the run read its data (:class:`DataLayout`: data shards, batch size, seq length, seed,
the SP layout) and where it stood in global samples; :func:`resume_plan` maps that position onto the resuming run's
layout (another number of processes or batch size continues at the same global sample, never training one twice)
and refuses a change that makes the position meaningless (seq length, data order, dataset, model).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler

from easy_context.models.config_compat import save_model


class EpochShuffleSampler(Sampler[int]):
    """A fresh permutation per epoch from ``seed + epoch``: the data order is a pure function of
    (seed, epoch), so a resumed run replays it exactly by skipping the batches already consumed."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


STATE_JSON = "easy_context_state.json"
RESUME_AUTO = "auto"  # --resume-from auto: the newest complete state of the output dir (last_good_checkpoint), if any
RNG_STATE = "random_states_{}.pkl"
_STATE_DIR = re.compile(r"state-step(\d+)$")
_TEMP = re.compile(r"\.(.+)\.(tmp|old)$")  # .state-step4.tmp: a save under way; .state-step4.old: being replaced


class CheckpointError(RuntimeError):
    """A checkpoint that could not be written or read; the message is one line naming the file and the fix."""


_HELD: list[torch.Tensor] = []  # the last agreement's tensors (see _agree)


def _agree(error: str | None) -> str | None:
    """The first rank's error (every rank gets the same answer; also a barrier), or None when all succeeded.

    Two all-gathers of tensors that stay referenced here until the next agreement. (``all_gather_object`` dropped
    its tensors while gloo's worker thread still held them: that thread then needs the GIL to free them, and a
    process whose main thread frees the process group (a DDP model going out of scope after a save) joins it
    holding the GIL: a 2-process run ending with a state save and ``--no-save`` hung at exit, forever.)"""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return error
    world = dist.get_world_size()
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    data = (error or "").encode()
    size = torch.tensor([len(data) + (error is not None)], dtype=torch.int64, device=device)  # 0: no error
    sizes = torch.empty(world, dtype=torch.int64, device=device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch < 2.13: the old name
    gather(sizes, size)
    width = max(int(sizes.max()), 1)
    mine = torch.zeros(width, dtype=torch.uint8)
    mine[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    mine = mine.to(device)
    every = torch.empty(world * width, dtype=torch.uint8, device=device)
    gather(every, mine)
    _HELD[:] = [size, sizes, mine, every]
    for rank, n in enumerate(sizes.tolist()):
        if n:
            return bytes(every[rank * width : rank * width + n - 1].tolist()).decode(errors="replace")
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            _fsync(Path(dirpath) / name)
        _fsync(Path(dirpath))


def _files(root: Path) -> dict[str, int]:
    """{relative path: size} of every file under ``root``."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def _cause(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno:
        return f"{exc.strerror or os.strerror(exc.errno)} (errno {errno.errorcode.get(exc.errno, exc.errno)})"
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(exc).__name__}: {text[:200]}"


def _failed_file(exc: BaseException, temp: Path, rank: int) -> str:
    """The file a failed save was writing: the error's own, else this rank's newest file in the temp dir."""
    name = getattr(exc, "filename", None)
    if name:
        return str(name)
    other_rng = re.compile(r"random_states_(\d+)\.pkl$")
    mine = [p for p in temp.rglob("*")
            if p.is_file() and (other_rng.search(p.name) is None or p.name == RNG_STATE.format(rank))]  # fmt: skip
    return str(max(mine, key=lambda p: p.stat().st_mtime_ns)) if mine else str(temp)


def _free(path: Path) -> str:
    try:
        return f"{shutil.disk_usage(path).free / 2**20:.0f} MiB free there"
    except OSError:
        return "free space unknown"


def _last_good_hint(output_dir: Path, exclude: Path | None = None) -> str:
    last = last_good_checkpoint(output_dir, exclude)
    if last is None:
        return f"no complete training state in {output_dir}"
    return f"last good checkpoint: {last} (resume with --resume-from {last})"


def _save_fix(exc: BaseException) -> str:
    """What to do about a failed save, by its cause: space, permission, a model that cannot be serialized, else
    nothing beyond the exception itself."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free disk space (or choose another --output-dir) and resume"
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make --output-dir writable for this user (or choose another --output-dir) and resume"
    if "serializ" in str(exc).lower():
        return (
            "the model cannot be written as it is (e.g. weights still quantized, as a GGUF loaded without "
            "dequantizing); load it as a plain model (easy_context loads .gguf files dequantized) and resume"
        )
    return "fix the cause above and resume"


def _save_error(what: str, exc: BaseException, temp: Path, rank: int, output_dir: Path, exclude: Path | None) -> str:
    return (
        f"saving {what}: writing {_failed_file(exc, temp, rank)} failed: {_cause(exc)} ({_free(output_dir)}); "
        f"nothing under that name was changed; {_last_good_hint(output_dir, exclude)}; {_save_fix(exc)}"
    )


def _replace_dir(temp: Path, final: Path) -> None:
    """Rename ``temp`` to ``final``; an existing ``final`` is moved aside first and removed after."""
    old = final.with_name(f".{final.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(temp, final)
    _fsync(final.parent)
    if old.exists():
        shutil.rmtree(old)


def remove_stale_temp(output_dir: str | Path) -> list[str]:
    """Clear what an interrupted save left in ``output_dir`` (main process, at start): ``.NAME.tmp`` dirs are
    removed; a ``.NAME.old`` (a replaced state whose successor never got its name) is renamed back to NAME if
    that is missing, else removed. Returns what was done, one line each."""
    done = []
    root = Path(output_dir)
    if not root.is_dir():
        return done
    for path in sorted(root.iterdir()):
        match = _TEMP.fullmatch(path.name)
        if match is None:
            continue
        target = root / match.group(1)
        if match.group(2) == "old" and not target.exists():
            os.replace(path, target)
            done.append(f"restored {target} (an interrupted save had moved it to {path.name})")
        else:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            done.append(f"removed {path} (left by an interrupted save)")
    return done


@dataclass(frozen=True)
class DataLayout:
    """How a run reads its data, recorded in every state so that a resume can tell what its position means.

    ``data_shards``: ranks that read different batches (the DP replicas: world / sp_size under SP, the world under
    data_parallel); ``batch_size``: rows per micro-batch and shard; ``batches_per_epoch``: micro-batches per shard
    and epoch (``len`` of the prepared loader: ceil(ceil(rows / batch_size) / data_shards), the last round padded
    from the epoch's start, as accelerate's even_batches does); ``dataset_rows``: rows of the dataset;
    ``seq_length`` and ``seed`` (the data order) and ``model`` (:func:`model_fingerprint`) must not change on
    resume. The rest describe the layout (reported when it changes)."""

    data_shards: int
    batch_size: int
    batches_per_epoch: int
    dataset_rows: int
    seq_length: int
    seed: int
    model: str = ""
    world_size: int = 1
    sp_size: int = 1
    parallel_mode: str = ""
    options: dict = field(default_factory=dict)
    gradient_accumulate_every: int = 1

    def position(self, micro_batches: int) -> dict[str, int]:
        """{"epoch", "sample"}: where ``micro_batches`` micro-batches per shard leave the data, in global samples
        (the first ``sample`` rows of epoch ``epoch``'s permutation are done; round r of an epoch reads its batches
        r * data_shards .. (r + 1) * data_shards - 1)."""
        epoch, rounds = divmod(micro_batches, self.batches_per_epoch)
        return {"epoch": epoch, "sample": rounds * self.data_shards * self.batch_size}


# what a resume may not change: the flag that sets it, and why
_FIXED = {
    "seq_length": ("--seq-length", "the dataset's rows are other rows then"),
    "seed": ("--seed", "the data order follows it"),
    "dataset_rows": ("--dataset (rows)", "it is another dataset"),
    "model": ("--model / --rope-theta", "the saved weights are of that model"),
}


def model_fingerprint(config: Any) -> str:
    """What identifies a model for a resume: architecture, sizes, vocabulary and RoPE base of a transformers config
    (a local copy of the same model has the same fingerprint; another model or RoPE base does not)."""
    from easy_context.models import get_rope_theta

    names = ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "vocab_size")  # fmt: skip
    fields = [f"{n}={getattr(config, n, None)}" for n in names]
    return " ".join([*fields, f"rope_theta={get_rope_theta(config)}"])


@dataclass(frozen=True)
class ResumePlan:
    """:func:`resume_plan`'s answer: skip ``micro_batches`` micro-batches per shard (this run's layout); ``notes``:
    lines to print (a changed layout, samples skipped to reach a round boundary); ``tokens``: the global tokens the
    state had trained (None: not recorded), for a tokens counter that survives a change of layout."""

    micro_batches: int
    notes: tuple[str, ...] = ()
    tokens: int | None = None


def check_unchanged(position: dict, directory: str | Path = "", **current: Any) -> None:
    """:class:`CheckpointError` when a field of :data:`_FIXED` given in ``current`` (``seq_length=``, ``seed=``,
    ``dataset_rows=``, ``model=``) differs from the state's record (``position``: :func:`read_training_position`).
    Cheap: a run can call it before it builds anything. States without a record pass."""
    saved = position.get("layout") or {}
    for name, value in current.items():
        if name not in _FIXED:
            raise TypeError(f"check_unchanged() takes {', '.join(_FIXED)}, not {name!r}")
        if value is None or name not in saved or saved[name] in ("", None) or saved[name] == value:
            continue
        flag, why = _FIXED[name]
        raise CheckpointError(
            f"--resume-from {directory}: the state was trained with {flag} {saved[name]}, this run has {value} "
            f"({why}, so the saved position does not apply); resume with {flag} {saved[name]}, or start a new run "
            "in another --output-dir"
        )


def resume_plan(position: dict, layout: DataLayout, directory: str | Path = "") -> ResumePlan:
    """Where this run (``layout``) continues the data of a state (``position``: :func:`read_training_position`).

    Same layout: the saved micro-batch count. Another one (data shards, batch size): the same global sample, in
    micro-batches of this layout; when that sample is not at a round boundary here (a round reads
    ``data_shards * batch_size`` samples), the run moves on to the next boundary and a note says how many samples
    it skips (none is ever trained twice). A changed seq length, seed, dataset or model raises
    :class:`CheckpointError` (:func:`check_unchanged`). A state without a layout record (written before layouts
    were recorded) is taken to be of this layout, with a note."""
    mine = dataclasses.asdict(layout)
    check_unchanged(position, directory, **{name: mine[name] for name in _FIXED})
    saved = position.get("layout")
    consumed, tokens = position["micro_batches"], position.get("tokens")
    if not saved:
        note = (f"{directory}: the state records no data layout (written before layouts were recorded): its "
                f"{consumed} micro-batches are taken to be of this run's layout; resume on the one it was "
                "trained on")  # fmt: skip
        return ResumePlan(consumed, (note,), tokens)
    changed = {k: (saved.get(k), v) for k, v in mine.items() if k not in _FIXED and saved.get(k) != v}
    if not changed:
        return ResumePlan(consumed, (), tokens)
    old = DataLayout(**{k: v for k, v in saved.items() if k in mine})
    at = old.position(consumed)
    per_round = layout.data_shards * layout.batch_size
    rounds = -(-at["sample"] // per_round)  # round up: skip, never repeat
    resumed = at["epoch"] * layout.batches_per_epoch + rounds
    skipped = min(rounds * per_round, layout.dataset_rows) - at["sample"]
    what = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items() if k != "batches_per_epoch")
    notes = [f"resuming on another layout ({what}): at global sample {at['sample']} of epoch {at['epoch']} "
             f"({consumed} micro-batches per shard there, {resumed} here)"]  # fmt: skip
    if skipped:
        notes.append(f"{skipped} samples of epoch {at['epoch']} skipped to reach a round boundary of this layout (a "
                     f"round reads {layout.data_shards} shards x {layout.batch_size} rows): none is trained "
                     "twice")  # fmt: skip
    return ResumePlan(resumed, tuple(notes), tokens)


def save_training_state(accelerator, directory: str | Path, step: int, micro_batches: int, skipped_steps: int,
                        layout: DataLayout | None = None, tokens: int | None = None,
                        config: dict | None = None) -> None:  # fmt: skip
    """Model, optimizer, scheduler and RNG states (accelerate) plus the data position, the count of steps whose
    update ``--nonfinite skip`` dropped and the size of every file, written atomically (see the module doc).
    ``layout`` (:class:`DataLayout`) is recorded with the position in global samples, for :func:`resume_plan`;
    ``tokens``: global tokens trained so far; ``config``: the run's resolved settings (JSON-able, for people).
    Raises :class:`CheckpointError` on every rank when any rank failed; ``directory`` is then as it was."""
    final = Path(directory)
    temp = final.with_name(f".{final.name}.tmp")
    rank = accelerator.process_index
    error = None
    if accelerator.is_main_process:
        try:
            if temp.exists():
                shutil.rmtree(temp)
            temp.mkdir(parents=True)
        except OSError as exc:
            error = _save_error(str(final), exc, temp, rank, final.parent, None)
    if not _agree(error):
        try:
            accelerator.save_state(str(temp))
        except Exception as exc:  # any I/O failure: every rank must hear of it (or the others wait forever)
            error = _save_error(str(final), exc, temp, rank, final.parent, None)
    error = _agree(error)
    if error is None and accelerator.is_main_process:
        try:
            position = {"step": step, "micro_batches": micro_batches, "skipped_steps": skipped_steps}
            if layout is not None:
                position["layout"] = dataclasses.asdict(layout)
                position["data"] = layout.position(micro_batches)
            if tokens is not None:
                position["tokens"] = tokens
            if config is not None:
                position["config"] = json.loads(json.dumps(config, default=str))
            position["files"] = _files(temp)
            path = temp / STATE_JSON
            path.write_text(json.dumps(position))
            _fsync_tree(temp)
            _replace_dir(temp, final)
        except Exception as exc:
            error = _save_error(str(final), exc, temp, rank, final.parent, None)
    error = _agree(error)
    if error is not None:
        if accelerator.is_main_process:
            shutil.rmtree(temp, ignore_errors=True)
        raise CheckpointError(error)


def check_training_state(directory: str | Path, process_index: int | None = None) -> dict:
    """The position JSON of a complete state dir (see :func:`read_training_position`); raises
    :class:`CheckpointError` naming the first missing, truncated or unreadable file."""
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"{root}: no such directory")
    path = root / STATE_JSON
    if not path.exists():
        raise CheckpointError(f"{path} is missing (a half-written or not a training state dir)")
    try:
        position = json.loads(path.read_text())
        keys = ("step", "micro_batches")
        if not isinstance(position, dict) or not all(isinstance(position.get(k), int) for k in keys):
            raise ValueError("no integer step and micro_batches")
        layout = position.get("layout")
        counts = ("data_shards", "batch_size", "batches_per_epoch")
        if layout is not None and not (isinstance(layout, dict) and all(
                isinstance(layout.get(k), int) and layout[k] > 0 for k in counts)):  # fmt: skip
            raise ValueError(f"its layout record lacks positive integer {', '.join(counts)}")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path} is corrupt ({type(exc).__name__}: {exc})") from None
    for name, size in position.get("files", {}).items():  # states written before sizes were recorded: none
        file = root / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing")
        if file.stat().st_size != size:
            raise CheckpointError(f"{file} is truncated or changed ({file.stat().st_size} bytes, saved {size})")
    rng = root / RNG_STATE.format(0 if process_index is None else process_index)
    if rng.name in position.get("files", {rng.name: None}):  # a rank the state had (else it starts from --seed)
        try:
            states = torch.load(rng, weights_only=False)
            missing = {"random_state", "numpy_random_seed", "torch_manual_seed"} - set(states)
        except Exception as exc:
            raise CheckpointError(f"{rng} is unreadable ({_cause(exc)})") from None
        if missing:
            raise CheckpointError(f"{rng} lacks {', '.join(sorted(missing))}")
    return {"skipped_steps": 0, **position}  # states written before skips were counted


def last_good_checkpoint(output_dir: str | Path, exclude: str | Path | None = None) -> Path | None:
    """The ``state-stepN`` dir of ``output_dir`` with the highest N that :func:`check_training_state` accepts."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    skip = Path(exclude).resolve() if exclude is not None else None
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STATE_DIR.fullmatch(p.name)) and p.is_dir()]
    for _, path in sorted(found, reverse=True):
        if skip is not None and path.resolve() == skip:
            continue
        try:
            check_training_state(path)
        except CheckpointError:
            continue
        return path
    return None


def read_training_position(directory: str | Path, process_index: int | None = None) -> dict:
    """{"step", "micro_batches", "skipped_steps", ...} of a state dir, without loading its state (cheap: a run can
    tell it has nothing to do before it builds a model). The dir is checked first (its files, their sizes, this
    rank's RNG state): a :class:`CheckpointError` names the bad file and the last good state next to it."""
    try:
        return check_training_state(directory, process_index)
    except CheckpointError as exc:
        hint = _last_good_hint(Path(directory).parent, exclude=directory)
        raise CheckpointError(f"--resume-from {directory}: {exc}; {hint}") from None


def load_training_state(accelerator, directory: str | Path) -> None:
    """Restore the states :func:`save_training_state` wrote (its data position: :func:`read_training_position`)."""
    try:
        accelerator.load_state(str(directory))
    except Exception as exc:  # a file that changed since read_training_position, or does not fit this model
        hint = _last_good_hint(Path(directory).parent, exclude=directory)
        raise CheckpointError(f"--resume-from {directory}: loading failed: {_cause(exc)}; {hint}") from None


def save_hf_checkpoint(accelerator, train_model, tokenizer, output_dir: str | Path) -> None:
    """Full weights as safetensors + config (with the RoPE base in use) + tokenizer, loadable by
    ``AutoModelForCausalLM.from_pretrained`` (under ZeRO-3 the shards are gathered first). Written into a temp dir,
    fsynced, then each file renamed into ``output_dir`` (none is ever half-written there); raises
    :class:`CheckpointError` on every rank when that fails."""
    state = accelerator.get_state_dict(train_model)
    root = Path(output_dir)
    temp = root / ".final-model.tmp"
    error = None
    if accelerator.is_main_process:
        try:
            if temp.exists():
                shutil.rmtree(temp)
            temp.mkdir(parents=True)
            hf_model = accelerator.unwrap_model(train_model).model
            state = {k.removeprefix("model."): v for k, v in state.items()}
            attn = hf_model.config._attn_implementation
            hf_model.config._attn_implementation_internal = "sdpa"  # do not save our runtime attention name
            try:
                save_model(hf_model, str(temp), state_dict=state, safe_serialization=True)
            finally:
                hf_model.config._attn_implementation_internal = attn
            if tokenizer is not None:
                tokenizer.save_pretrained(str(temp))
            _fsync_tree(temp)
            for name in sorted(_files(temp)):
                os.replace(temp / name, root / name)
            _fsync(root)
            temp.rmdir()
        except Exception as exc:
            error = _save_error(f"the final model to {root}", exc, temp, 0, root, None)
            shutil.rmtree(temp, ignore_errors=True)
    error = _agree(error)
    if error is not None:
        raise CheckpointError(error)
