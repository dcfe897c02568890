"""The headline number of a context extension: each trained model's gain over the best training-free baseline, per
task and length, on the same prompts.

A model is *trained* when its name is ``control`` or starts with ``extended`` (the pipeline's names); the *shorter
route* (``stage_yarn``: the last stage before the target, trained to a shorter length, with YaRN over the rest at
inference) is the cheap trained alternative a user tries first, compared on its own; every other evaluated model
(``base``, ``rope_theta``, ``linear``, ``dynamic_ntk``, ``yarn``) is a training-free baseline. In a
cell (task, length) the best baseline is the one with the highest score there; the gain is the trained model's score
minus that score (None where no baseline has the cell). Beyond the trained length the trained model's needle under
each of its inference-time scalings is compared with the baselines' needle beyond it under theirs (the base with YaRN
at the full factor).
"""

from __future__ import annotations

BEYOND = "needle beyond"
SHORTER_ROUTE = "stage_yarn"


def is_trained(name: str) -> bool:
    """Whether ``name`` is a trained model (the extension or its control), not a training-free baseline."""
    return name == "control" or name.startswith("extended")


def training_free(names) -> list[str]:
    """The training-free baselines among ``names``, in their order (not the trained models, not the shorter route)."""
    return [n for n in names if not is_trained(n) and n != SHORTER_ROUTE]


def task_scores(model: dict) -> dict[str, dict[int, float]]:
    """{task: {length: score}} of one model's summary (:func:`easy_context.eval.compare.model_summary`): the needle,
    the needle with 3 distractors, each RULER task, and the needle beyond the trained length per scaling
    (``"needle beyond (yarn:2:1024)"``)."""
    out: dict[str, dict[int, float]] = {}
    for task, key in (("needle", "needle"), ("needle, 3 distractors", "needle_3_distractors")):
        if model.get(key):
            out[task] = {int(n): v for n, v in model[key]["by_length"].items() if v is not None}
    for task, row in ((model.get("ruler") or {}).get("scores") or {}).items():
        out[task] = {int(n): v for n, v in row.items() if v is not None}
    for label, nd in (model.get("needle_long") or {}).items():
        out[f"{BEYOND} ({label})"] = {int(n): v for n, v in nd["by_length"].items() if v is not None}
    return out


def _group(task: str) -> str:
    """The cells a task is compared with: every scaling's needle beyond the trained length is one group."""
    return BEYOND if task.startswith(BEYOND) else task


def gains(models: dict[str, dict], against: list[str] | None = None) -> list[dict]:
    """One row per trained model (``extended*``; not the control), task and length it was scored at: ``model``,
    ``task``, ``length``, ``score``, ``best_baseline`` (its name, with its scaling beyond the trained length),
    ``best_baseline_score``, ``gain`` (score - best; None without a baseline in the cell), rounded to 4 places, and
    ``baselines_scored``: how many of the compared models scored the cell (fewer than all: the best of those only).
    ``against``: the models compared with (default: the training-free baselines)."""
    best: dict[tuple[str, int], tuple[float, str]] = {}
    scored: dict[tuple[str, int], set[str]] = {}
    for name in training_free(models) if against is None else [n for n in against if n in models]:
        for task, row in task_scores(models[name]).items():
            label = name if _group(task) == task else f"{name} ({task[len(BEYOND) + 2 : -1]})"
            for length, score in row.items():
                cell = (_group(task), length)
                scored.setdefault(cell, set()).add(name)
                if cell not in best or score > best[cell][0]:
                    best[cell] = (score, label)
    rows: list[dict] = []
    if against is not None and not best:
        return rows
    for name in (n for n in models if n.startswith("extended")):
        for task, row in task_scores(models[name]).items():
            for length, score in sorted(row.items()):
                cell = (_group(task), length)
                found = best.get(cell)
                rows.append({"model": name, "task": task, "length": length, "score": round(score, 4),
                             "best_baseline": found[1] if found else None,
                             "best_baseline_score": round(found[0], 4) if found else None,
                             "gain": round(score - found[0], 4) if found else None,
                             "baselines_scored": len(scored.get(cell, ()))})  # fmt: skip
    return rows


def headline(models: dict[str, dict]) -> str:
    """The first line of an extension's summary: which training-free baselines its gains are over, or that none
    (or only the unscaled base) ran."""
    free = training_free(models)
    scaled = [n for n in free if n != "base"]
    if not free:
        return ("# No training-free baseline was evaluated: this result does not show what training adds (no gain is "
                "computed; BASELINES, docs/extension.md)")  # fmt: skip
    if not scaled:
        return ("# No training-free scaling baseline was evaluated, only the unscaled base: the gains below are over "
                "the base, not over free RoPE scaling (BASELINES, docs/extension.md)")  # fmt: skip
    return (f"# Gain of training over the best of {len(free)} training-free baselines on the same prompts "
            f"({', '.join(free)})")  # fmt: skip
