"""Time estimates of an extension plan beyond its training stages, and the units a plan prints its numbers in.

Estimates, not measurements: each is a count from the recipe's settings (the pipeline's own,
easy_context.extend.settings) at a stated rate.

* Data: every packed length tokenizes the corpus again (CORPUS_CHARS characters) at :data:`DATA_CHARS_PER_S`.
* Evaluations: the forward tokens of each evaluation the pipeline runs (needle cells, perplexity windows, RULER
  prompts, the needle beyond the target), each at its length's forward FLOPs (a third of training's) on one GPU at
  the plan's MFU. The pipeline runs them beside the training: the total counts them in full, an upper bound.
* The control (CONTROL=1): as many tokens as all stages, trained at the base length.
* Not counted: the model's download, RULER's generated answers.

When the evaluations take longer than the training (:func:`evaluations_dominate`), the plan names the settings that
cut them (:data:`EVAL_CUTS`) with their estimate, and says that they run on one GPU whatever the run's GPU count.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from easy_context.extend.settings import Settings
from easy_context.tasks.needle import context_lengths, depth_percents
from easy_context.tasks.ruler.builders import DEFAULT_TASKS
from easy_context.training.flops import GPUS, Gpu, train_flops_per_token

# measured: run 5 of docs/extension_smollm2.md built its corpus (CORPUS_CHARS 1.6e8) and packed it once in 69 s with
# 12 processes on the H200 machine
DATA_CHARS_PER_S = 1.6e8 / 69
NEEDLE_DEPTH_INTERVAL = 0.25  # the pipeline's --depth_interval
DISTRACTOR_SAMPLES = 2  # the needle with distractors: --num_samples 2 (base and extended models)
# the pipeline settings that cut the evaluations most and keep the comparison of the base with the extended model:
# no RULER, no needle beyond the trained length, no training-free baseline but the base, one needle sample
EVAL_CUTS = {"RULER": "0", "LONG": "0", "BASELINES": "base", "SAMPLES": "1"}


def gpu(name: str) -> Gpu:
    """The datasheet figures of ``--gpu NAME``; a one-line ValueError naming the known names."""
    key = name.lower().replace(" ", "-")
    if key not in GPUS:
        raise ValueError(f"--gpu {name}: not a GPU this table knows; give one of {', '.join(GPUS)} (or its nearest, "
                         "and --gpu-mem for its memory)")  # fmt: skip
    return GPUS[key]


def format_tokens(n: float) -> str:
    """A token count to 3 significant figures: 512, 12.3K, 4.5M, 1.2B."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def format_seconds(s: float) -> str:
    """A duration to 2-3 significant figures in the unit that reads best: 850 ms, 12.3 s, 4.5 min, 2.3 h, 3.1 days."""
    for scale, unit in ((86400.0, " days"), (3600.0, " h"), (60.0, " min"), (1.0, " s")):
        if s >= scale:
            return f"{s / scale:.3g}{unit}"
    return f"{s * 1e3:.3g} ms"


@dataclass(frozen=True)
class Extra:
    """One estimated part of a plan beyond its training stages: seconds, and how they were counted."""

    name: str
    seconds: float
    why: str


def data(settings: Settings, lengths: int) -> Extra:
    """The corpus tokenized and packed once per length."""
    chars = float(settings.corpus_chars)
    seconds = lengths * chars / DATA_CHARS_PER_S
    return Extra("data", seconds, f"{chars:.3g} characters tokenized for each of {lengths} lengths at "
                                  f"{DATA_CHARS_PER_S / 1e6:.2g}M characters/s")  # fmt: skip


def _needle(settings: Settings, lo: int, hi: int, step: int, samples: int) -> list[tuple[int, int]]:
    """(length, sequences) of a needle sweep: every length x depth x sample."""
    if hi < lo:
        return []
    depths = len(depth_percents(NEEDLE_DEPTH_INTERVAL))
    return [(length, depths * samples) for length in context_lengths(lo, hi, step)]


def _doubling(lo: int, hi: int) -> list[int]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


def evaluation_sequences(settings: Settings) -> list[tuple[int, int]]:
    """(length, sequences) of every forward pass the pipeline's evaluations run (a perplexity length counted as one
    window of each of PPL_SAMPLES documents, else one)."""
    s = settings
    needle = _needle(s, int(s.needle_min), int(s.needle_max), int(s.needle_step), int(s.samples))
    ppl_docs = int(s.ppl_samples or 1)
    ppl = [(int(s.short), ppl_docs), *((n, ppl_docs) for n in _doubling(int(s.short), int(s.ppl_max)))]
    models = list(s.baselines) if s.only != "train" else []
    if s.train and s.only != "before":
        models += ["extended", *(["control"] if s.control else [])]
    out: list[tuple[int, int]] = []
    for name in models:
        out += needle + ppl
        if name in ("base", "extended"):
            out += _needle(s, int(s.needle_min), int(s.needle_max), int(s.needle_step), DISTRACTOR_SAMPLES)
    ruler_models = [m for m in models if m in ("base", "extended")] if s.ruler else []
    for _ in ruler_models:
        lengths = [int(n) for n in s.ruler_lengths_to(s.target).split(",")]
        out += [(n, len(DEFAULT_TASKS) * int(s.ruler_samples)) for n in lengths]
    if s.long and "extended" in models:
        for _ in s.long_scaling_list():
            out += _needle(s, int(s.long_min), int(s.long), int(s.long_step), int(s.long_samples))
    return out


def evaluations(config: PretrainedConfig, settings: Settings, peak_flops: float, mfu: float) -> Extra:
    """The evaluations' forward FLOPs on one GPU at ``mfu`` of ``peak_flops``."""
    sequences = evaluation_sequences(settings)
    tokens = sum(length * count for length, count in sequences)
    flops = sum(length * count * train_flops_per_token(config, length) / 3 for length, count in sequences)
    return Extra("evaluations", flops / (peak_flops * mfu), f"{format_tokens(tokens)} tokens forward in "
                 f"{sum(c for _, c in sequences):,} sequences, one GPU at {mfu:.0%} MFU")  # fmt: skip


def control(config: PretrainedConfig, settings: Settings, tokens: int, gpus: int, peak_flops: float,
            mfu: float) -> Extra | None:  # fmt: skip
    """The control run (CONTROL=1): ``tokens`` trained at the base length on every GPU."""
    if not (settings.control and settings.train and settings.only != "before"):
        return None
    seconds = tokens * train_flops_per_token(config, settings.base_length) / (gpus * peak_flops * mfu)
    return Extra("control", seconds, f"{format_tokens(tokens)} tokens at the base length "
                                     f"{settings.base_length:,}")  # fmt: skip


def evaluations_dominate(evaluations_s: float, training_s: float) -> bool:
    """Whether the evaluations' estimate exceeds the training's: then the plan names what cuts them."""
    return evaluations_s > training_s


def evaluation_cut(evals: Extra, cut: Extra, training_s: float, gpus: int, total_s: float) -> str:
    """The plan's line when the evaluations dominate: where they run, and :data:`EVAL_CUTS`' estimate (``cut``) with
    the plan's total (``total_s``) under it."""
    where = (f"one GPU of the {gpus}: the pipeline starts each as one process, whatever --gpus" if gpus > 1 else
             "one GPU: the pipeline starts each as one process")  # fmt: skip
    settings = " ".join(f"{k}={v}" for k, v in EVAL_CUTS.items())
    return (f"evaluations dominate (~{format_seconds(evals.seconds)} against ~{format_seconds(training_s)} of "
            f"training) and run on {where}; {settings} cut them to ~{format_seconds(cut.seconds)} (in all "
            f"~{format_seconds(total_s - evals.seconds + cut.seconds)})")  # fmt: skip
