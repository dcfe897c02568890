"""The runs of tests/e2e/test_trainer.py: ``transformers.Trainer`` / TRL ``SFTTrainer`` on a tiny model, plain (one
process, the reference) or with easy_context sequence parallelism (``accelerate launch``, 2 gloo processes) under
DDP and FSDP2 (job ``sp``) and DeepSpeed ZeRO-3 with CPU offload (job ``zero3``).

``python tests/support/trainer_job.py ref OUT_DIR`` / ``accelerate launch ... tests/support/trainer_job.py sp|zero3
OUT_DIR`` write ``OUT_DIR/<run>.json`` (rank 0): the logged losses and grad norms of each step, train_loss and
eval_loss (``ref`` also saves the initial tiny model to ``OUT_DIR/lm_init``: the ZeRO-3 run loads it
partitioned). Each job then runs its bad setups (one launch for all: most of a job's time is its imports); ``sp``'s
last one ends the job with an error (tests/e2e/test_trainer.py reads the lines they print, then the exit status).

``zero3`` is launched as a GPU user launches it, with an accelerate DeepSpeed config
(accelerate_configs/cpu_zero3.yaml) and without ACCELERATE_USE_CPU (it switches DeepSpeed off); on CPU its runs
pass ``ddp_backend="gloo"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from easy_context.training.process_exit import exit_process  # noqa: E402
from tests.support.models import tiny_config  # noqa: E402

STEPS, BATCH, ACCUM, LR = 4, 2, 2, 2e-3
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
         "romeo sierra tango uniform victor whiskey xray yankee zulu").split()  # fmt: skip


def tiny_model(vocab: int, heads: int = 4, kv_heads: int = 2, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = tiny_config("llama", heads=heads, kv_heads=kv_heads, vocab_size=vocab, pad_token_id=0, **overrides)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()


@contextlib.contextmanager
def environment(**changes: str) -> Iterator[None]:
    """``os.environ`` with ``changes`` inside, as it was after: accelerate and transformers leave flags behind
    (``ACCELERATE_USE_FSDP=true`` once an Accelerator had an FSDP plugin), which would leak into the job's next run."""
    saved = dict(os.environ)
    os.environ.update(changes)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def fsdp2_args_on_cpu(**kw):
    """``TrainingArguments(**kw)`` with FSDP2, and accelerate's state made FSDP on CPU as a GPU launch makes it.

    accelerate 1.15 turns FSDP on for GPU-type devices only (on CPU its state stays MULTI_CPU and the plugin is
    dropped: SequenceParallelTrainer refuses that). Here the state is built by hand, with the plugin
    TrainingArguments derives, and Trainer takes it as it is (``use_configured_state``); everything after it is
    accelerate's and Trainer's own FSDP2 code (``fsdp2_prepare_model``: fully_shard of each decoder layer, of the
    embedding and of [final norm, LM head], then the root; the FSDP2 grad-norm clip; the full state dict on save).
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, TorchDynamoPlugin
    from transformers import TrainingArguments

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState(cpu=True)  # the launcher's processes, gloo
    fsdp_config = {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "reshard_after_forward": True,
                   "cpu_ram_efficient_loading": True, "state_dict_type": "FULL_STATE_DICT"}  # fmt: skip
    args = TrainingArguments(
        **kw, fsdp=True, fsdp_config=fsdp_config, accelerator_config={"use_configured_state": True}
    )
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    state = AcceleratorState(cpu=True, fsdp_plugin=plugin, dynamo_plugin=TorchDynamoPlugin(), _from_accelerator=True)
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    state.fsdp_plugin = plugin
    return args


def common_args(out: str, accum: int = ACCUM) -> dict:
    return dict(output_dir=out, per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
                gradient_accumulation_steps=accum, max_steps=STEPS, learning_rate=LR, lr_scheduler_type="linear",
                warmup_steps=0, logging_steps=1, save_strategy="no", report_to="none", seed=0, use_cpu=True,
                disable_tqdm=True, dataloader_num_workers=0)  # fmt: skip


class Rows(torch.utils.data.Dataset):
    def __init__(self, rows: list[dict]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def lm_rows(n: int, length: int, vocab: int, seed: int) -> Rows:
    """Random token rows (labels = input ids) of a length no SP layout divides (30: zigzag on 2 pads to 32)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, length), generator=g)
    return Rows([{"input_ids": r, "labels": r.clone()} for r in ids])


def word_tokenizer():
    """A word-level tokenizer built here (no hub): pad 0, bos 1, eos 2, unk 3, then the words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", padding_side="right")  # fmt: skip


def sft_dataset(n: int, seed: int):
    """Prompt/completion pairs of varied lengths: SFT masks the prompt (-100), so rows have 2..9 valid targets."""
    import random

    from datasets import Dataset

    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 14))) for _ in range(n)]
    completions = [" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(n)]
    return Dataset.from_dict({"prompt": prompts, "completion": completions})


def record(trainer, train_out, eval_loss=None) -> dict:
    hist = [h for h in trainer.state.log_history if "loss" in h]
    return {"loss": [h["loss"] for h in hist], "grad_norm": [float(h["grad_norm"]) for h in hist],
            "train_loss": train_out.training_loss, "eval_loss": eval_loss}  # fmt: skip


LM_VOCAB = 64


def run_lm(out: str, sp: str | None, engine: str = "ddp", **sp_kw) -> dict:
    """``engine``: ``"ddp"`` (accelerate's default), ``"fsdp2"`` (:func:`fsdp2_args_on_cpu`) or ``"zero3"`` (the
    launch's DeepSpeed config; the model is loaded after the arguments, so ZeRO-3 partitions it as it loads, from
    the reference's initial weights in ``lm_init``)."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    import easy_context as ec
    from easy_context.training.trainer import SequenceParallelTrainer

    ec.reset_groups()
    with environment():
        if engine == "fsdp2":
            args = fsdp2_args_on_cpu(**common_args(out))
        elif engine == "zero3":
            args = TrainingArguments(**{**common_args(out), "use_cpu": False, "ddp_backend": "gloo"})
        else:
            args = TrainingArguments(**common_args(out))
        if engine == "zero3":
            model = AutoModelForCausalLM.from_pretrained(Path(out).parent / "lm_init", attn_implementation="eager")
        else:
            model = tiny_model(LM_VOCAB)
        partitioned = model.get_output_embeddings().weight.numel() == 0  # ZeRO-3: a (0,) placeholder per rank
        kw = dict(model=model, args=args, train_dataset=lm_rows(16, 30, LM_VOCAB, 1),
                  eval_dataset=lm_rows(4, 30, LM_VOCAB, 2))  # fmt: skip
        trainer = Trainer(**kw) if sp is None else SequenceParallelTrainer(**kw, sp=sp, **sp_kw)
        res = trainer.train()
        head = type(trainer.model.get_output_embeddings().weight).__name__  # FSDP2: a DTensor shard after a step
        trainer.save_model(f"{out}/final")  # the trained weights, compared by the test
        rec = record(trainer, res, trainer.evaluate()["eval_loss"])
        rec.update(engine=trainer.accelerator.distributed_type.value, partitioned_at_load=partitioned, head=head)
    unset_hf_deepspeed_config()  # models built later in this process: not partitioned by ZeRO-3
    return rec


def run_sft(out: str, sp: str | None, accum: int = ACCUM, **sp_kw) -> dict:
    from trl import SFTConfig, SFTTrainer

    import easy_context as ec
    from easy_context.training.trainer import sequence_parallel_trainer

    ec.reset_groups()  # the runs of one job use different DP x SP meshes
    tok = word_tokenizer()
    cfg = SFTConfig(**common_args(out, accum), bf16=False, gradient_checkpointing=False, max_length=64)
    kw = dict(model=tiny_model(len(tok)), args=cfg, train_dataset=sft_dataset(16, 3), processing_class=tok)
    cls = SFTTrainer if sp is None else sequence_parallel_trainer(SFTTrainer)
    trainer = cls(**kw) if sp is None else cls(**kw, sp=sp, **sp_kw)
    res = trainer.train()
    rec = record(trainer, res)
    # what the run trained on: per row, its tokens and its targets (the prompt is -100)
    rec["rows"] = [(len(row["labels"]), sum(x != -100 for x in row["labels"][1:])) for row in trainer.train_dataset]
    return rec


# the 2-process runs and the 1-process reference each reproduces: an SP group of 2 reads what one process reads;
# 2 DP replicas of SP size 1 with accumulation 2 read per step what one process reads with accumulation 4
RUNS = {
    "ref": {"lm": lambda o: run_lm(o, None), "sft": lambda o: run_sft(o, None),
            "sft_accum4": lambda o: run_sft(o, None, accum=2 * ACCUM)},
    "sp": {"lm_zigzag": lambda o: run_lm(o, "zigzag_ring_attn"),
           "sft_zigzag": lambda o: run_sft(o, "zigzag_ring_attn"),
           "sft_ulysses_logits": lambda o: run_sft(o, "ulysses_attn", sp_loss="logits"),
           "sft_dp2_zigzag": lambda o: run_sft(o, "zigzag_ring_attn", sp_size=1),
           "lm_zigzag_fsdp2": lambda o: run_lm(o, "zigzag_ring_attn", engine="fsdp2")},
    "zero3": {"lm_zigzag_zero3": lambda o: run_lm(o, "zigzag_ring_attn", engine="zero3"),
              "lm_ulysses_logits_zero3": lambda o: run_lm(o, "ulysses_attn", engine="zero3", sp_loss="logits")},
}  # fmt: skip


def run_errors(out: str) -> None:
    """Bad setups: all but the last raise on every rank and are reported here; the last one ends the job."""
    from transformers import TrainingArguments

    import easy_context as ec
    from easy_context.training.trainer import SequenceParallelTrainer

    ec.reset_groups()
    rank = int(os.environ.get("RANK", "0"))
    args = TrainingArguments(**{**common_args(out), "max_steps": 1})
    data = lm_rows(8, 30, 64, 1)
    try:  # 3 K/V heads cannot be split over the 2 ranks of Ulysses: refused at construction
        model = tiny_model(64, heads=3, kv_heads=3, hidden_size=48)
        SequenceParallelTrainer(model=model, args=args, train_dataset=data, sp="ulysses_attn")
    except ValueError as exc:
        print(f"rank {rank} ERROR heads: {exc}", flush=True)
    try:  # length 30 does not shard over zigzag's 2 x 2 chunks, and padding is switched off
        SequenceParallelTrainer(model=tiny_model(64), args=args, train_dataset=data, sp="zigzag_ring_attn",
                                sp_pad=False).train()  # fmt: skip
    except ValueError as exc:
        print(f"rank {rank} ERROR length: {exc}", flush=True)

    def collate(rows, left_pad_on=None, shift=0):
        batch = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
        batch["input_ids"] = (batch["input_ids"] + shift) % 64
        if rank == left_pad_on:  # left padding: not supported (custom attention gets no key mask)
            batch["attention_mask"] = torch.ones_like(batch["input_ids"])
            batch["attention_mask"][0, :3] = 0
        return batch

    try:  # a collator that gives the ranks of the SP group different tokens: caught by the same-batch check
        SequenceParallelTrainer(model=tiny_model(64), args=args, train_dataset=data, sp="zigzag_ring_attn",
                                data_collator=lambda rows: collate(rows, shift=rank)).train()  # fmt: skip
    except RuntimeError as exc:
        print(f"rank {rank} ERROR batches: {exc}", flush=True)
    run_engine_errors(out, rank, {"fsdp on cpu": ({"fsdp": True, "fsdp_config": {"version": 2}}, {})})
    print(f"rank {rank} starting the left-padded run", flush=True)
    SequenceParallelTrainer(model=tiny_model(64), args=args, train_dataset=data, sp="zigzag_ring_attn",
                            data_collator=lambda rows: collate(rows, left_pad_on=1)).train()  # fmt: skip
    print(f"rank {rank} the left-padded run trained (it should have raised)", flush=True)


def run_engine_errors(out: str, rank: int, setups: dict[str, tuple[dict, dict]]) -> None:
    """Setups refused at construction with a ValueError, reported here: ``setups`` maps a name to the
    TrainingArguments keywords and the environment variables set while they are built."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    import easy_context as ec
    from easy_context.training.trainer import SequenceParallelTrainer

    for name, (kw, env) in setups.items():
        ec.reset_groups()
        model = tiny_model(LM_VOCAB)  # before the arguments: ZeRO-3 does not partition it at construction
        try:
            with environment(**env):
                args = TrainingArguments(**{**common_args(f"{out}/{name}"), "max_steps": 1, **kw})
                SequenceParallelTrainer(model=model, args=args, train_dataset=lm_rows(8, 30, LM_VOCAB, 1),
                                        sp="zigzag_ring_attn")  # fmt: skip
            print(f"rank {rank} {name}: constructed (it should have raised)", flush=True)
        except ValueError as exc:
            print(f"rank {rank} ERROR {name}: {exc}", flush=True)
        finally:
            unset_hf_deepspeed_config()  # models built later in this process: not partitioned by ZeRO-3


def zero3_errors() -> dict[str, tuple[dict, dict]]:
    """DeepSpeed setups refused under a DeepSpeed launch on CPU."""
    ds_sp = {
        **json.loads((ROOT / "accelerate_configs" / "zero3_offload.json").read_text()),
        "sequence_parallel_size": 2,
    }
    return {
        "no gloo": ({"use_cpu": False}, {}),  # transformers gives DeepSpeed's process group no backend: 1 process
        "ACCELERATE_USE_CPU": ({}, {"ACCELERATE_USE_CPU": "1"}),  # accelerate drops DeepSpeed: DDP
        "two sp schemes": ({"deepspeed": ds_sp}, {}),  # DeepSpeed's own (Ulysses) sequence parallelism as well
    }


def main() -> None:
    which, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    if which == "ref":
        tiny_model(LM_VOCAB).save_pretrained(out / "lm_init")  # the ZeRO-3 runs' initial weights
    for name, run in RUNS[which].items():
        result = run(str(out / name))
        if int(os.environ.get("RANK", "0")) == 0:
            (out / f"{name}.json").write_text(json.dumps(result))
    if which == "sp":
        run_errors(str(out / "errors"))
    if which == "zero3":
        run_engine_errors(str(out / "errors"), int(os.environ.get("RANK", "0")), zero3_errors())


if __name__ == "__main__":
    main()
    exit_process(0)
