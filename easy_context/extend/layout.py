"""Whether a plan's training runs can run: each run's length and the model's heads held to train.py's own check
(:meth:`easy_context.sp_config.SPConfig.check_run`: the backend's layout rule, its length multiple, head split and
GQA) for the plan's backend on its processes, before anything runs.

    runs = [Run("stage1_32768", 32768), Run("extended", 131072)]
    PlanLayout("zigzag_ring_attn", nproc=3).check(config, runs)  # LayoutError: "... multiple of 6 ...; fix: ..."
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from easy_context.core.layout import Layout


class LayoutError(ValueError):
    """A plan train.py would refuse at launch; its message is one line naming the fix."""


class Run(NamedTuple):
    """One train.py run of a plan: its name (the pipeline's stage) and its sequence length in tokens."""

    name: str
    seq_length: int


def next_multiple(length: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``length``."""
    return -(-length // multiple) * multiple


@dataclass(frozen=True)
class PlanLayout:
    """How a plan launches train.py: ``mode`` (--parallel_mode) on ``nproc`` processes, ``sp_size`` ranks per
    sequence (None: all), the backend's ``options`` (ring_degree)."""

    mode: str
    nproc: int = 1
    sp_size: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sp(self) -> int:
        """Ranks per sequence group (train.py: --sp-size, else every process)."""
        return self.sp_size or self.nproc

    @property
    def shares_sequences(self) -> bool:
        """Whether the ranks of an SP group share each sequence (the backend's rule); False for data_parallel."""
        from easy_context.core.registry import get_seq_algo

        return get_seq_algo(self.mode).distributed

    @property
    def sequences(self) -> int:
        """Sequences a step trains (one per SP group; one per process under data_parallel); 0 when sp-size does not
        divide the processes."""
        if not self.shares_sequences:
            return self.nproc
        return self.nproc // self.sp if self.sp and self.nproc % self.sp == 0 else 0

    def describe(self) -> str:
        given = "".join(f", {k} {v}" for k, v in self.options.items() if v is not None)
        sp = self.sp if self.shares_sequences else 1
        processes = f"{self.nproc} process{'es' if self.nproc > 1 else ''}"
        return f"{self.mode} on {processes} (SP {sp} x DP {self.sequences}{given})"

    def layout(self, config: Any | None) -> Layout:
        """The backend's layout for ``config``'s heads (None: heads unknown, only the options and the process count
        are checked), or LayoutError naming the fix."""
        from easy_context.sp_config import sp_config_for

        if self.nproc % self.sp:
            raise LayoutError(f"sp-size {self.sp} does not divide the {self.nproc} processes; fix: an sp-size that "
                              f"divides {self.nproc}")  # fmt: skip
        try:
            sp = sp_config_for(self.mode, self.sp, dp_size=self.nproc // self.sp, **self.options)
            return sp.check_model(config) if config is not None else sp.layout(self.sp, self.sp)
        except (TypeError, ValueError) as exc:
            raise LayoutError(f"{self.describe()}: {exc}") from None

    def multiple(self, config: Any | None) -> int:
        """The number every run's length must be a multiple of (LayoutError when the heads cannot split)."""
        return self.layout(config).multiple

    def check(self, config: Any | None, runs: Sequence[Run], fix: str = "") -> str:
        """One line saying that every run passes train.py's layout check; LayoutError (one line: the first run that
        does not, train.py's reason, and ``fix`` or the next multiple) otherwise."""
        from easy_context.sp_config import sp_config_for

        lay = self.layout(config)
        sp = sp_config_for(self.mode, self.sp, dp_size=self.nproc // self.sp, **self.options)
        for run in runs:
            try:
                if config is None:
                    lay.check_length(run.seq_length)
                else:
                    sp.check_run(config, run.seq_length)
            except ValueError:
                hint = fix or f"seq-length {next_multiple(run.seq_length, lay.multiple)} (the next multiple)"
                raise LayoutError(
                    f"{run.name} at {run.seq_length} tokens cannot run as {self.describe()}: train.py "
                    f"needs a length that is a multiple of {lay.multiple} there; fix: {hint}"
                ) from None
        heads = "" if config is None else f", heads {lay.ulysses}-way split" if lay.ulysses > 1 else ""
        return (
            f"layout: {self.describe()}: lengths multiple of {lay.multiple}{heads}; every training run passes "
            f"train.py's layout check" + ("" if config is not None else " (lengths only: no model config here)")
        )
