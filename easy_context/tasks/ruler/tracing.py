"""Multi-hop tracing (``vt``): chains of ``VAR B = VAR A`` statements, each on a line of its own between noise
lines, after a worked example, as RULER writes them since its "fix VT" commit (26ed7ba)."""

from __future__ import annotations

import random

from easy_context.tasks.ruler.fit import largest_fitting
from easy_context.tasks.ruler.retrieval import NOISE
from easy_context.tasks.ruler.tasks import LONG, Count, Render, RulerTask
from easy_context.tasks.ruler.vocab import distinct, number, variable_name

VT_PROMPT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: "
    "Find all variables that are assigned the value {query} in the text above."
)
VT_ANSWER = (
    " Answer: According to the chain(s) of variable assignment in the text above, {count} variables are assigned the "
    "value {query}, they are: "
)
VT_EXAMPLE_TOKENS = 500  # the worked example is a VT prompt of this many tokens (with its budget), as RULER's


def _vt_statements(rng: random.Random, task: RulerTask, letters: int, value: str | None) -> list[list[str]]:
    """``task.chains`` chains of ``task.hops`` hops, each ``[VAR A = value, VAR B = VAR A , ...]`` (a hop statement
    ends in a space, as RULER writes it); the first chain's value is the one asked."""
    used: set[str] = set()
    chains = []
    for _ in range(task.chains):
        names = distinct(rng, lambda r: variable_name(r, letters), task.hops + 1, used)
        chain_value = value or number(rng, 5)
        chains.append([f"VAR {names[0]} = {chain_value}"] + [f"VAR {b} = VAR {a} " for a, b in zip(names, names[1:])])
    return chains


def _vt_context(chains: list[list[str]], n: int, layout_seed: float) -> str:
    """``n`` noise lines with every statement on a line of its own, as RULER lays them out: each chain in turn takes
    distinct line indexes drawn uniformly (sorted) among the lines so far, its j-th statement going before the line
    at its index (so two statements of one chain always have noise between them). Joined by newlines. The draw
    depends on ``layout_seed`` and ``n`` only."""
    rng = random.Random(f"{layout_seed}:{n}")
    lines = [NOISE] * n
    for chain in chains:
        at = sorted(rng.sample(range(max(len(lines), len(chain))), len(chain)))
        for j, (index, statement) in enumerate(zip(at, chain)):
            lines.insert(min(index + j, len(lines)), statement)
    return "\n".join(lines)


def _vt_render(chains: list[list[str]], layout_seed: float) -> Render:
    value = chains[0][0].split("= ")[1]
    names = [line.split()[1] for line in chains[0]]

    def render(n: int) -> tuple[str, str, list[str]]:
        body = VT_PROMPT.format(context=_vt_context(chains, n, layout_seed), query=value)
        return body, VT_ANSWER.format(count=len(names), query=value), names

    return render


def _vt_example(task: RulerTask, rng: random.Random, count: Count, length: int, layout: random.Random) -> str:
    """RULER's worked VT example: a VT prompt with 3-letter names (at most 10 hops) whose prompt, answer prefix
    included, is at most 500 tokens (scaled down below 4K tokens), then a space, its answer and a newline. Its size
    and statement lines come from ``layout`` (one draw per task and length, as RULER makes one example per run); its
    names and value from ``rng`` (per prompt, as RULER's ``randomize_icl`` redraws them)."""
    shape = RulerTask("vt_example", "vt", task.max_new_tokens, chains=task.chains, hops=min(task.hops, 10))
    layout_seed = layout.random()
    sized = _vt_render(_vt_statements(layout, shape, 3, "12345"), layout_seed)
    budget = VT_EXAMPLE_TOKENS * min(length, LONG) // LONG
    try:
        n = largest_fitting(lambda n: count("".join(sized(n)[:2])), budget)
    except ValueError:  # a prompt far below RULER's lengths: the example without noise
        n = 0
    body, prefix, answers = _vt_render(_vt_statements(rng, shape, 3, None), layout_seed)(n)
    return body + prefix + " " + " ".join(answers) + "\n"


def vt(task: RulerTask, rng: random.Random, count: Count, length: int, layout: random.Random) -> Render:
    example = _vt_example(task, random.Random(rng.random()), count, length, layout)
    chain = _vt_render(_vt_statements(rng, task, 5, None), rng.random())

    def render(n: int) -> tuple[str, str, list[str]]:
        body, prefix, answers = chain(n)
        return example + "\n" + body, prefix, answers

    return render
