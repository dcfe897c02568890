"""NVIDIA RULER's own NIAH generator per seed: the haystack size its search settles on and each prompt's fill
((prompt tokens + tokens_to_generate) / length) with a given tokenizer; the reference the fill table in docs/evals.md
is compared with (bench/ruler_fill.py gives this generator's side).

    python bench/ruler_reference_fill.py --ruler PATH/RULER --tokenizer TOKENIZER_DIR --task niah_multikey_3 \\
        --length 8192 --seeds 0-118 --samples 10

RULER's ``scripts/data/synthetic/niah.py`` runs unmodified from the checkout, with the task's arguments from its
``synthetic.yaml`` and its prompt from ``constants.py`` (base template). Its imports that such a run does not use are
stood in for: the tokenizer module (as RULER's ``hf`` type: ``AutoTokenizer.from_pretrained(path).tokenize``), the
manifest writer (nothing is written) and, where nltk is not installed, nltk's sentence splitter (only the essay
haystack calls it: essay tasks then need nltk). Each seed reseeds RULER's random streams as its start does
(``random.seed``, ``np.random.seed``, ``--random_seed``), so a seed gives the prompts of ``--random_seed SEED``.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import types
from collections import Counter
from pathlib import Path


def _seeds(text: str) -> list[int]:
    """``"0-5,42"`` -> [0, 1, 2, 3, 4, 5, 42]."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out += list(range(int(first), int(last or first) + 1))
    return out


def _stand_ins(tokenizer_path: str) -> None:
    """The modules niah.py imports that this run replaces (see the module's docstring)."""
    from transformers import AutoTokenizer

    class HFTokenizer:
        def __init__(self, path: str):
            self.tokenizer = AutoTokenizer.from_pretrained(path)

        def text_to_tokens(self, text: str) -> list[str]:
            return self.tokenizer.tokenize(text)

    tokenizer = types.ModuleType("tokenizer")
    tokenizer.select_tokenizer = lambda kind, path: HFTokenizer(path)
    manifest = types.ModuleType("manifest_utils")
    manifest.write_manifest = lambda path, rows: None
    sys.modules.update({"tokenizer": tokenizer, "manifest_utils": manifest})
    try:
        import nltk.tokenize  # noqa: F401
    except ImportError:

        def sent_tokenize(text: str) -> list[str]:
            raise RuntimeError("the essay haystack splits sentences with nltk: pip install nltk")

        nltk = types.ModuleType("nltk")
        nltk.tokenize = types.ModuleType("nltk.tokenize")
        nltk.tokenize.sent_tokenize = sent_tokenize
        sys.modules.update({"nltk": nltk, "nltk.tokenize": nltk.tokenize})


def load_niah(ruler: Path, task: str, tokenizer_path: str, length: int, samples: int):
    """RULER's niah.py as a module, its arguments set for ``task`` at ``length`` (``--random_seed`` set per seed)."""
    import yaml

    data = ruler / "scripts" / "data"
    synthetic = data / "synthetic"
    if not (synthetic / "niah.py").is_file():
        raise SystemExit(f"error: {synthetic / 'niah.py'} not found: --ruler is a checkout of github.com/NVIDIA/RULER")
    config = yaml.safe_load((data.parent / "synthetic.yaml").read_text())
    if config.get(task, {}).get("task") != "niah":
        names = ", ".join(name for name, c in config.items() if c.get("task") == "niah")
        raise SystemExit(f"error: --task {task!r} is not one of RULER's NIAH tasks: {names}")
    sys.path[:0] = [str(synthetic), str(data)]
    _stand_ins(tokenizer_path)
    from constants import TASKS  # RULER's

    niah = TASKS["niah"]
    task_args = [f"--{k}={v}" for k, v in config[task]["args"].items()]
    sys.argv = ["niah.py", "--save_dir=unused", "--save_name=unused", f"--tokenizer_path={tokenizer_path}",
                "--tokenizer_type=hf", f"--max_seq_length={length}",
                f"--tokens_to_generate={niah['tokens_to_generate']}", f"--num_samples={samples}",
                f"--template={niah['template'] + niah['answer_prefix']}", *task_args]  # fmt: skip
    spec = importlib.util.spec_from_file_location("ruler_niah", synthetic / "niah.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_seed(module, seed: int, length: int, samples: int) -> tuple[int, list[float]]:
    """(the searched size, each prompt's fill) of RULER's run with ``--random_seed seed``."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    module.args.random_seed = seed
    searching, searched = [True], []
    make, progress = module.generate_input_output, module.tqdm

    def traced(n: int):
        if not searching[0] and not searched:  # the sample loop's first try is the size the search settled on
            searched.append(n)
        return make(n)

    def samples_start(iterable, *args, **kwargs):  # the search is over once the sample loop begins
        searching[0] = False
        return iter(iterable)

    module.generate_input_output, module.tqdm = traced, samples_start
    try:
        rows = module.generate_samples(samples, length, "unused")
    finally:
        module.generate_input_output, module.tqdm = make, progress
    return searched[0], [row["length"] / length for row in rows]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ruler", type=Path, required=True, help="a checkout of github.com/NVIDIA/RULER")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder (AutoTokenizer.from_pretrained)")
    p.add_argument("--task", default="niah_multikey_3")
    p.add_argument("--length", type=int, default=8192)
    p.add_argument("--seeds", default="1-5,42", help="RULER --random_seed values: '0-118', '1-5,42'")
    p.add_argument("--samples", type=int, default=10)
    args = p.parse_args(argv)
    if args.samples < 1:
        p.error("--samples must be at least 1 (the searched size is read from the first prompt)")
    module = load_niah(args.ruler, args.task, args.tokenizer, args.length, args.samples)
    landed: Counter[int] = Counter()
    for seed in _seeds(args.seeds):
        searched, fills = run_seed(module, seed, args.length, args.samples)
        landed[searched] += 1
        print(f"seed {seed}: searched {searched}, fill median {statistics.median(fills):.3f} "
              f"[{min(fills):.3f}-{max(fills):.3f}]", flush=True)  # fmt: skip
    print("searched sizes over the seeds: " + ", ".join(f"{n}: {k}" for n, k in sorted(landed.items())))


if __name__ == "__main__":
    main()
