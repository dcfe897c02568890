"""transformers.Trainer (or TRL's SFTTrainer) with easy_context sequence parallelism, on a tiny model.

    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml examples/trainer_sp.py
    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml examples/trainer_sp.py --trl --backend usp_attn
    torchrun --nproc-per-node 8 examples/trainer_sp.py --sp-size 4 --seq-length 32768   # GPUs: 2 DP x 4 SP

The task is SFT-shaped: a prompt of random tokens, a separator, then a completion counting on from the prompt's last
token; only the completion is trained on (prompt labels -100), so rows have different numbers of targets and the
loss is the exact token mean of each optimizer step over every rank. Both ranks of an SP group read the same rows
and each attends over its shard of the sequence. ~20 s on 2 CPU cores (most of it imports).
"""

from __future__ import annotations

import argparse
import random

import torch


def counting_rows(n: int, length: int, vocab: int, seed: int) -> list[dict]:
    """Rows ``prompt SEP completion`` of ``length`` tokens at most: a prompt of random tokens (1/4..3/4 of the row),
    then counting on from the prompt's last token; only the completion is trained on (prompt labels -100)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        k = rng.randint(length // 4, 3 * length // 4)
        prompt = [rng.randrange(3, vocab) for _ in range(k)]
        completion = [3 + (prompt[-1] - 3 + i) % (vocab - 3) for i in range(1, rng.randint(2, length - k))]
        rows.append({"input_ids": prompt + [2] + completion, "labels": [-100] * (k + 1) + completion})
    return rows


def pad_right(rows: list[dict]) -> dict[str, torch.Tensor]:
    """A collator: right padding (pad id 0, labels -100) with an attention_mask, as tokenizers' collators do."""
    width = max(len(r["input_ids"]) for r in rows)
    pad = lambda xs, v: torch.tensor([x + [v] * (width - len(x)) for x in xs])  # noqa: E731
    ids = pad([r["input_ids"] for r in rows], 0)
    return {"input_ids": ids, "labels": pad([r["labels"] for r in rows], -100), "attention_mask": (ids != 0).long()}


def tiny_tokenizer(vocab: int):
    """A tokenizer built here, no hub (SFTTrainer wants one; the rows are already token ids): pad 0, bos 1, eos 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", bos_token="t1", eos_token="t2",
                                   unk_token="t3")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="zigzag_ring_attn", help="easy_context.SEQ_ALGOS: the SP backend")
    parser.add_argument("--sp-size", type=int, default=None, help="ranks per sequence (default: every process)")
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trl", action="store_true", help="TRL's SFTTrainer (prompt/completion rows) instead")
    parser.add_argument("--output-dir", default="/tmp/easy_context_trainer_sp")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, LlamaConfig, TrainingArguments

    from easy_context.training.trainer import SequenceParallelTrainer, sequence_parallel_trainer

    vocab = 64
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.seq_length,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    rows = counting_rows(256, args.seq_length, vocab, seed=0)
    common = dict(output_dir=args.output_dir, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                  max_steps=args.steps, learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=2,
                  logging_steps=5, save_strategy="no", report_to="none", seed=0, use_cpu=not torch.cuda.is_available(),
                  disable_tqdm=True)  # fmt: skip
    sp = dict(sp=args.backend, sp_size=args.sp_size)
    if args.trl:  # SFTTrainer tokenizes nothing here: the rows are already ids with their labels
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        config = SFTConfig(**common, bf16=False, gradient_checkpointing=False, max_length=None)
        trainer = sequence_parallel_trainer(SFTTrainer)(
            model=model, args=config, train_dataset=Dataset.from_list(rows), data_collator=pad_right,
            processing_class=tiny_tokenizer(vocab), **sp,
        )  # fmt: skip
    else:
        trainer = SequenceParallelTrainer(model=model, args=TrainingArguments(**common), train_dataset=rows,
                                          data_collator=pad_right, **sp)  # fmt: skip
    result = trainer.train()
    if trainer.is_world_process_zero():
        s = trainer.sp
        print(f"{args.backend}: {s.dp_size} DP x {s.sp_size} SP, {trainer.accelerator.num_processes} processes; "
              f"losses {[round(h['loss'], 3) for h in trainer.state.log_history if 'loss' in h]}, "
              f"train_loss {result.training_loss:.4f}")  # fmt: skip


if __name__ == "__main__":
    from easy_context.training.process_exit import exit_process

    main()
    exit_process(0)  # no process-group teardown at exit (easy_context.training.process_exit explains why)
