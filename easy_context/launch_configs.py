"""The accelerate / DeepSpeed launch configs that ship with the package (a checkout's ``accelerate_configs/``).

    accelerate launch --config_file "$(easy-context-train --print-config-path single_node)" -m easy_context.train ...
    python -m easy_context.launch_configs              # the names; with a NAME: its path

``single_node``, ``two_node``, ``fsdp2_offload``, ``deepspeed_inference``, ``cpu_2proc``, ``cpu_zero3`` (yaml, for
``--config_file``) and ``zero3_offload.json`` / ``deepspeed_inference.json`` (DeepSpeed). A DeepSpeed yaml names its
json relative to the checkout's root (``accelerate_configs/zero3_offload.json``), where the checkout's scripts run;
from any other directory :func:`path` returns a copy of the yaml (in the user's cache dir) naming the json by its
absolute path.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "accelerate_configs"
_DS_FILE = re.compile(r"^(\s*deepspeed_config_file:\s*)(\S+)[ \t]*$", re.M)


def names() -> list[str]:
    """The shipped configs: yaml files by their stem, json files with their suffix."""
    files = sorted(CONFIG_DIR.glob("*.yaml")) + sorted(CONFIG_DIR.glob("*.json"))
    return [f.stem if f.suffix == ".yaml" else f.name for f in files]


def path(name: str) -> str:
    """The file of config ``name`` (``single_node``, ``single_node.yaml``, ``zero3_offload.json``) as a path usable
    from the current directory; ValueError naming the shipped configs for an unknown name."""
    file = CONFIG_DIR / (name if name.endswith((".yaml", ".json")) else f"{name}.yaml")
    if not file.is_file():
        raise ValueError(f"no launch config {name!r}; shipped: {', '.join(names())}")
    match = _DS_FILE.search(file.read_text()) if file.suffix == ".yaml" else None
    if match is None:
        return str(file)
    target = CONFIG_DIR / Path(match.group(2)).name
    if Path(match.group(2)).is_file() and Path(match.group(2)).resolve() == target.resolve():
        return str(file)  # run from a checkout's root: the file as it is
    text = file.read_text()
    text = text[: match.start(2)] + str(target) + text[match.end(2) :]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "easy_context" / "accelerate_configs"
    copy = cache / file.name
    if not copy.is_file() or copy.read_text() != text:
        cache.mkdir(parents=True, exist_ok=True)
        copy.write_text(text)
    return str(copy)


# the planner's ZeRO-3 placements (easy_context.plan's --optim) and what each moves to host memory
ZERO3_OFFLOADS = {"zero3": (), "zero3_offload_optimizer": ("offload_optimizer",),
                  "zero3_offload": ("offload_optimizer", "offload_param")}  # fmt: skip


def zero3_config(optim: str, num_processes: int, folder: str | os.PathLike, cpu: bool = False) -> str:
    """The accelerate yaml (and the DeepSpeed json it names, both written into ``folder``) that launches the planner's
    ZeRO-3 placement ``optim`` on ``num_processes`` processes of one machine: zero3_offload.json less the offloads
    ``optim`` does not make. ``cpu``: CPU processes (``use_cpu``, no ZeRO-3 init of the model, as cpu_zero3).
    Returns the yaml's absolute path; ValueError naming the placements for another ``optim``."""
    if optim not in ZERO3_OFFLOADS:
        raise ValueError(f"optim {optim!r} is not a ZeRO-3 placement; one of {', '.join(ZERO3_OFFLOADS)}")
    import yaml

    config = json.loads((CONFIG_DIR / "zero3_offload.json").read_text())
    for key in ("offload_optimizer", "offload_param"):
        if key not in ZERO3_OFFLOADS[optim]:
            config["zero_optimization"].pop(key)
    out = Path(folder).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{optim}.json").write_text(json.dumps(config, indent=2) + "\n")
    launch = yaml.safe_load((CONFIG_DIR / "single_node.yaml").read_text())  # the shipped ZeRO-3 launch, adapted
    launch["deepspeed_config"] |= {"deepspeed_config_file": str(out / f"{optim}.json"), "zero3_init_flag": not cpu}
    launch |= {"num_processes": num_processes, "use_cpu": cpu}
    path = out / f"{optim}.yaml"
    path.write_text(yaml.safe_dump(launch, sort_keys=False))
    return str(path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip().split("\n\n")[0] + "\n\nusage: python -m easy_context.launch_configs [NAME]\n")
        print("\n".join(names()))
        return 0
    try:
        print(path(argv[0]))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
