"""The DistFlashAttn schedule: which (query chunk, key/value chunk) block each rank computes at each step.

Rank r holds contiguous chunk r of W. Under causal masking chunk i attends to chunks j <= i, so with every
rank computing its own queries rank r would do r + 1/2 blocks (a diagonal block counts 1/2) and rank W-1
would take W steps. Here each unordered pair {a, b} of ranks (a < b) is one full block (b, a), assigned
round-robin by ring distance t = (b - a) or (a - b) mod W:

* step 0: every rank computes its diagonal block (r, r);
* step t = 1 .. ceil(W/2) - 1: rank r computes the block of the pair {r, p}, p = (r + t) mod W.
  If p > r rank r is the *helper*: it borrows the queries of p and attends them to its own K/V, then
  sends the partial (out, lse) back to p. If p < r (wrapped) rank r borrows the K/V of p for its own queries;
* step W/2 (even W only): both ends of a pair {l, u = l + W/2} meet at distance W/2, so they split its
  block by query rows (:func:`task_rows`): the upper rank u attends the first half of its queries to the
  borrowed K/V of l, the lower rank l attends the second half of u's queries (borrowed) to its own K/V.

So low ranks (little causal work of their own) spend most steps helping high ranks: 1 + floor(W/2) steps,
and every rank does exactly the mean W/2 blocks: (W - 1)/2 full blocks plus its diagonal (odd W), or
W/2 - 1 full blocks plus its diagonal and one half block (even W). Without masking (``causal=False``)
the plain W-step schedule is used: rank r attends its queries to the K/V of rank (r - t) mod W at step t.

Everything here is pure (no tensors, no processes): the executors (``attention.py``, ``simulate.py``)
and the tests read the same :class:`Task` lists.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from easy_context.core.block import Block
from easy_context.core.documents import Documents, split_blocks
from easy_context.core.ring_schedule import RingSchedule, Tasks, whole_world
from easy_context.core.spans import Span


@dataclass(frozen=True)
class Task:
    """Rank ``runner`` computes the block of chunk ``q_owner``'s queries against chunk ``kv_owner``'s K/V.

    ``half`` is None for all of ``q_owner``'s query rows, else 0 / 1 for the first / second half of them
    (:func:`task_rows`); half blocks only occur at distance W/2 of an even world.
    """

    runner: int
    q_owner: int
    kv_owner: int
    half: int | None = None

    @property
    def diagonal(self) -> bool:
        return self.q_owner == self.kv_owner

    @property
    def borrows_q(self) -> bool:
        """The runner attends another rank's queries (and returns their partial out/lse or dq)."""
        return self.runner != self.q_owner

    @property
    def borrows_kv(self) -> bool:
        """The runner attends to another rank's K/V (and, in the backward, returns their partial dK/dV)."""
        return self.runner != self.kv_owner


Step = tuple[Task, ...]
Schedule = tuple[Step, ...]


@dataclass(frozen=True)
class Message:
    """``what`` travels from rank ``src`` to rank ``dst`` for ``task``.

    Fetches (before the task runs): ``"q"`` (forward: q; backward: q, dout, out, lse) and ``"kv"`` (k, v).
    Returns (after it ran): ``"out"`` (forward partial out, lse), ``"dq"`` and ``"dkv"`` (backward partials).
    """

    src: int
    dst: int
    what: str
    task: Task


def _causal(world: int) -> Schedule:
    steps: list[Step] = [tuple(Task(r, r, r) for r in range(world))]
    for t in range(1, world // 2 + 1):
        step = []
        for r in range(world):
            p = (r + t) % world
            if 2 * t == world:  # both ends of a pair meet at distance W/2: split the block by query rows
                if r >= t:
                    step.append(Task(r, r, p, half=0))  # upper: first half of my queries, borrowed K/V
                else:
                    step.append(Task(r, p, r, half=1))  # lower: borrowed second half of p's queries, my K/V
            elif p > r:
                step.append(Task(r, p, r))  # helper: borrowed queries against my K/V
            else:
                step.append(Task(r, r, p))  # my queries against borrowed K/V
        steps.append(tuple(step))
    return tuple(steps)


def _full(world: int) -> Schedule:
    return tuple(tuple(Task(r, r, (r - t) % world) for r in range(world)) for t in range(world))


@functools.cache
def build_schedule(world: int, causal: bool) -> Schedule:
    """The steps of the schedule for ``world`` ranks; each step has at most one task per runner."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    return _causal(world) if causal else _full(world)


def rank_task(step: Step, rank: int) -> Task | None:
    """The task ``rank`` runs in ``step`` (None when it idles)."""
    return next((task for task in step if task.runner == rank), None)


def fetches(step: Step) -> list[Message]:
    """Inputs that must reach the runners of ``step`` before it runs, in one order shared by all ranks."""
    msgs = []
    for task in step:
        if task.borrows_q:
            msgs.append(Message(task.q_owner, task.runner, "q", task))
        if task.borrows_kv:
            msgs.append(Message(task.kv_owner, task.runner, "kv", task))
    return msgs


def returns(step: Step, backward: bool) -> list[Message]:
    """Partial results the runners of ``step`` send back to the owners, in one order shared by all ranks."""
    msgs = []
    for task in step:
        if task.borrows_q:
            msgs.append(Message(task.runner, task.q_owner, "dq" if backward else "out", task))
        if backward and task.borrows_kv:
            msgs.append(Message(task.runner, task.kv_owner, "dkv", task))
    return msgs


@functools.cache
def comm_rounds(world: int, causal: bool, backward: bool) -> tuple[tuple[Message, ...], ...]:
    """The message rounds around the T steps of the schedule (T + 2 rounds).

    Round 0 runs before step 0 (its fetches); round s + 1 runs while step s computes (fetches of step s + 1,
    returns of step s - 1), so communication overlaps compute; round T + 1 returns the last step's partials.
    """
    steps = build_schedule(world, causal)
    rounds = [fetches(steps[0])]
    for s in range(len(steps)):
        msgs = fetches(steps[s + 1]) if s + 1 < len(steps) else []
        if s >= 1:
            msgs += returns(steps[s - 1], backward)
        rounds.append(msgs)
    rounds.append(returns(steps[-1], backward))
    return tuple(tuple(r) for r in rounds)


def task_rows(task: Task, seq_local: int) -> slice:
    """The rows of ``q_owner``'s chunk (``seq_local`` rows) that ``task`` covers; halves split floor/ceil.

    The first half is the (possibly empty, for one row) ``seq_local // 2`` rows the upper rank computes
    with borrowed K/V; the borrowed second half is never empty, so every message carries rows.
    """
    if task.half is None:
        return slice(0, seq_local)
    mid = seq_local // 2
    return slice(0, mid) if task.half == 0 else slice(mid, seq_local)


def task_blocks(task: Task, seq_local: int, causal: bool) -> list[Block]:
    """The blockwise blocks of ``task`` for chunks of ``seq_local`` rows, in the runner's coordinates.

    Key rows are the whole K/V chunk. Query rows index the runner's query tensor: its own chunk, or the
    borrowed rows only (:func:`task_rows`) when it borrows queries. Empty when the task covers no rows.
    """
    rows = task_rows(task, seq_local)
    n = rows.stop - rows.start
    if n == 0:
        return []
    q_rows = slice(0, n) if task.borrows_q else rows
    return [Block(q_rows, slice(0, seq_local), causal and task.diagonal)]


def task_spans(task: Task, seq_local: int) -> tuple[tuple[Span, ...], tuple[Span, ...]]:
    """Global rows of the runner's query tensor and K/V tensor for ``task`` (chunks of ``seq_local`` rows): its own
    chunk, or only the borrowed rows (:func:`task_rows`) of the query owner's chunk."""
    q_first = task.q_owner * seq_local
    if task.borrows_q:
        rows = task_rows(task, seq_local)
        q_spans = (Span(0, q_first + rows.start, rows.stop - rows.start),)
    else:
        q_spans = (Span(0, q_first, seq_local),)
    return q_spans, (Span(0, task.kv_owner * seq_local, seq_local),)


def task_document_blocks(task: Task, seq_local: int, causal: bool, documents: Documents | None, batch: int,
                         window: int | None = None):  # fmt: skip
    """:func:`task_blocks` split by ``documents`` (one sub-block per shared document; none when they share none) and
    cut by a causal sliding ``window`` (none when the task lies beyond it)."""
    blocks = task_blocks(task, seq_local, causal)
    if documents is None and window is None:
        return blocks
    return split_blocks(blocks, *task_spans(task, seq_local), documents, batch, window)


def block_cost(task: Task, causal: bool) -> float:
    """Work of one task in full blocks: a causal diagonal block or a half block is half a block."""
    if task.half is not None or (causal and task.diagonal):
        return 0.5
    return 1.0


def rank_work(world: int, causal: bool) -> list[float]:
    """Total work per rank, in full blocks."""
    work = [0.0] * world
    for step in build_schedule(world, causal):
        for task in step:
            work[task.runner] += block_cost(task, causal)
    return work


def rank_kernel_calls(world: int, causal: bool, seq_local: int = 2) -> list[int]:
    """Local kernel calls per rank in one forward (the backward makes the same number of backward calls).

    Depends on ``seq_local`` only for one-row chunks, whose empty first halves make no call.
    """
    calls = [0] * world
    for step in build_schedule(world, causal):
        for task in step:
            calls[task.runner] += len(task_blocks(task, seq_local, causal))
    return calls


def dist_flash_tasks(world: int, seq_length: int, causal: bool = True) -> Tasks:
    """``tasks[step][rank]`` of the balanced schedule on ``world`` ranks over ``seq_length`` rows: at most one task
    per rank and step."""
    s = seq_length // world
    out: Tasks = []
    for step in build_schedule(world, causal):
        row: list = [[] for _ in range(world)]
        for task in step:
            row[task.runner].append((task_blocks(task, s, causal), *task_spans(task, s)))
        out.append(row)
    return out


DIST_FLASH_RING = RingSchedule(ring_size=whole_world, tasks=dist_flash_tasks)
