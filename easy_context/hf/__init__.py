"""transformers integration: SP attention through ``AttentionInterface``; ``Trainer`` / TRL ``SFTTrainer`` under SP
(:mod:`easy_context.training.trainer`)."""

from easy_context.hf.attention import check_supported, make_hf_attention
from easy_context.hf.patch import apply_seq_parallel_monkey_patch, attention_name

_TRAINER_NAMES = ("SequenceParallelMixin", "SequenceParallelTrainer", "sequence_parallel_trainer")


def __getattr__(name: str):
    if name in _TRAINER_NAMES:  # imported on first use: transformers.Trainer is a heavy import
        from easy_context.hf import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["apply_seq_parallel_monkey_patch", "attention_name", "check_supported", "make_hf_attention",
           *_TRAINER_NAMES]  # fmt: skip
