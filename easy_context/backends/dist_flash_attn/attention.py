"""DistFlashAttn: contiguous shards, with helper ranks computing blocks for the heavily loaded ranks.

Each rank runs the tasks ``schedule.py`` gives it. A *rank program* (:class:`ForwardRank`,
:class:`BackwardRank`) holds one rank's tensors and says what it sends for each message, where received
tensors go, and how it computes a task with the blockwise functions; a *driver* moves the messages: the
distributed one here (``batch_isend_irecv``, each round overlapping a step's compute), the virtual one in
``simulate.py``. So both execute exactly the same blocks and merges in the same order.

Forward: a helper attends borrowed queries to its own K/V and returns the partial (out, lse), merged by
the owner in fp32 (``ForwardAccumulator``). Backward: a helper receives the borrowed queries' q, dout,
out and lse, adds the dK/dV of its own K/V locally and returns the fp32 partial dq; a rank that borrowed
K/V returns the fp32 partial dK/dV. Only K/V heads travel (GQA). A half task (even W, distance W/2)
moves and merges only its query rows (``task_rows``). Document masking: each task's block splits into one sub-block
per shared document (``task_document_blocks``); a helper's partial rows that share no document with its K/V
come back as (0, -inf) and merge without NaN. Messages are unchanged (every rank runs the same rounds). A sliding
window cuts the blocks the same way (:mod:`easy_context.core.windows`): a task beyond it makes no kernel call.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from easy_context.backends.dist_flash_attn.schedule import (
    Message,
    Task,
    build_schedule,
    comm_rounds,
    rank_task,
    task_document_blocks,
    task_rows,
)
from easy_context.comm import PendingExchange
from easy_context.core.blockwise import ForwardAccumulator, add_kv_grads_, backward_blocks, forward_blocks
from easy_context.core.distributed_attn import distributed_attention
from easy_context.core.documents import Documents
from easy_context.kernels import AttnKernel

NAME = "dist_flash_attn"
Tensors = tuple[torch.Tensor, ...]


def _empty(shape, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=like.device)


def _lse_shape(q: torch.Tensor, n: int) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[2], n)


def _rows_shape(x: torch.Tensor, n: int) -> tuple[int, ...]:
    """``x`` (b, s, ...) with ``n`` rows."""
    return (x.shape[0], n, *x.shape[2:])


def _count(rows: slice) -> int:
    return rows.stop - rows.start


class ForwardRank:
    """One rank's forward: its shards q (b, s, h, d), k/v (b, s, h_kv, d) and the fp32 (out, lse) of q."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: AttnKernel, scale: float, causal,
                 documents: Documents | None = None, window: int | None = None):  # fmt: skip
        self.q, self.k, self.v = q, k, v
        self.kernel, self.scale, self.causal, self.documents, self.window = kernel, scale, causal, documents, window
        self.masked = documents is not None or window is not None  # partial results may hold rows without keys
        self.acc = ForwardAccumulator(q)
        self.inbox: dict[tuple[Task, str], Tensors] = {}
        self.partials: dict[Task, Tensors] = {}

    def payload(self, msg: Message) -> Tensors:
        if msg.what == "q":
            return (self.q[:, task_rows(msg.task, self.q.shape[1])],)
        if msg.what == "kv":
            return (self.k, self.v)
        return self.partials.pop(msg.task)  # "out": (out in q's dtype, lse fp32) of the task's rows

    def buffers(self, msg: Message) -> Tensors:
        q, k = self.q, self.k
        n = _count(task_rows(msg.task, q.shape[1]))
        if msg.what == "q":
            return (_empty(_rows_shape(q, n), q.dtype, q),)
        if msg.what == "kv":
            return (_empty(k.shape, k.dtype, k), _empty(k.shape, self.v.dtype, k))
        return (_empty(_rows_shape(q, n), q.dtype, q), _empty(_lse_shape(q, n), torch.float32, q))

    def receive(self, msg: Message, tensors: Tensors) -> None:
        if msg.what == "out":  # under documents a partial may hold rows without keys
            self.acc.add(task_rows(msg.task, self.q.shape[1]), *tensors, complete=not self.masked)
        else:
            self.inbox[(msg.task, msg.what)] = tensors

    def run(self, task: Task) -> None:
        (q,) = self.inbox.pop((task, "q")) if task.borrows_q else (self.q,)
        k, v = self.inbox.pop((task, "kv")) if task.borrows_kv else (self.k, self.v)
        blocks = task_document_blocks(task, self.k.shape[1], self.causal, self.documents, q.shape[0], self.window)
        if task.borrows_q:  # helper: a partial result for the query owner
            part = ForwardAccumulator(q)
            forward_blocks(self.kernel, q, k, v, blocks, self.scale, part)
            self.partials[task] = part.result(q.dtype, require_covered=not self.masked)
        else:
            forward_blocks(self.kernel, q, k, v, blocks, self.scale, self.acc)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """out (b, s, h, d) in q's dtype, lse (b, h, s) fp32."""
        return self.acc.result(self.q.dtype)


class BackwardRank:
    """One rank's backward: its shards, the final out/lse of its queries, fp32 dq and dK/dV accumulators."""

    def __init__(self, dout, q, k, v, out, lse, kernel: AttnKernel, scale: float, causal: bool,
                 documents: Documents | None = None, window: int | None = None):  # fmt: skip
        self.dout, self.q, self.k, self.v, self.out, self.lse = dout, q, k, v, out, lse
        self.kernel, self.scale, self.causal, self.documents, self.window = kernel, scale, causal, documents, window
        self.dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        self.dkv = torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device)
        self.inbox: dict[tuple[Task, str], Tensors] = {}
        self.partials: dict[tuple[Task, str], Tensors] = {}

    def payload(self, msg: Message) -> Tensors:
        if msg.what == "q":
            rows = task_rows(msg.task, self.q.shape[1])
            return (self.q[:, rows], self.dout[:, rows], self.out[:, rows], self.lse[:, :, rows])
        if msg.what == "kv":
            return (self.k, self.v)
        return self.partials.pop((msg.task, msg.what))  # "dq" (fp32 q-shaped) / "dkv" (fp32 (2, *k.shape))

    def buffers(self, msg: Message) -> Tensors:
        q, k = self.q, self.k
        shape = _rows_shape(q, _count(task_rows(msg.task, q.shape[1])))
        if msg.what == "q":
            return (
                _empty(shape, q.dtype, q),
                _empty(shape, self.dout.dtype, q),
                _empty(shape, self.out.dtype, q),
                _empty(_lse_shape(q, shape[1]), torch.float32, q),
            )
        if msg.what == "kv":
            return (_empty(k.shape, k.dtype, k), _empty(k.shape, self.v.dtype, k))
        if msg.what == "dq":
            return (_empty(shape, torch.float32, q),)
        return (_empty((2, *k.shape), torch.float32, k),)

    def receive(self, msg: Message, tensors: Tensors) -> None:
        if msg.what == "dq":
            self.dq[:, task_rows(msg.task, self.q.shape[1])] += tensors[0]
        elif msg.what == "dkv":
            self.dkv += tensors[0]
        else:
            self.inbox[(msg.task, msg.what)] = tensors

    def run(self, task: Task) -> None:
        own_q = (self.q, self.dout, self.out, self.lse)
        q, dout, out, lse = self.inbox.pop((task, "q")) if task.borrows_q else own_q
        k, v = self.inbox.pop((task, "kv")) if task.borrows_kv else (self.k, self.v)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if task.borrows_q else self.dq
        blocks = task_document_blocks(task, self.k.shape[1], self.causal, self.documents, q.shape[0], self.window)
        kv_grads = backward_blocks(self.kernel, dout, q, k, v, out, lse, blocks, self.scale, dq)
        dkv = torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device) if task.borrows_kv else self.dkv
        add_kv_grads_(dkv, kv_grads)
        if task.borrows_q:
            self.partials[(task, "dq")] = (dq,)
        if task.borrows_kv:
            self.partials[(task, "dkv")] = (dkv,)

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.dq.to(self.q.dtype), self.dkv[0].to(self.k.dtype), self.dkv[1].to(self.v.dtype)


def _start_round(msgs, prog, rank: int, peers: list[int], group) -> PendingExchange:
    """Post this rank's sends and receives of ``msgs`` (the same order on every rank) in one batch."""
    ops, received, sent = [], {}, []
    for msg in msgs:
        if msg.src == rank:
            for t in prog.payload(msg):
                sent.append(t.contiguous())
                ops.append(dist.P2POp(dist.isend, sent[-1], peers[msg.dst], group))
        elif msg.dst == rank:
            received[msg] = prog.buffers(msg)
            ops.extend(dist.P2POp(dist.irecv, buf, peers[msg.src], group) for buf in received[msg])
    return PendingExchange(dist.batch_isend_irecv(ops) if ops else [], received, sent)


def _group_info(group) -> tuple[int, int, list[int], dist.ProcessGroup]:
    group = dist.group.WORLD if group is None else group
    world = dist.get_world_size(group)
    peers = [dist.get_global_rank(group, r) for r in range(world)]
    return world, dist.get_rank(group), peers, group


def _drive(prog, world: int, rank: int, peers: list[int], group, causal: bool, backward: bool) -> None:
    """Run this rank's tasks; round s + 1 of messages is in flight while step s computes."""
    steps = build_schedule(world, causal)
    for i, msgs in enumerate(comm_rounds(world, causal, backward)):
        flight = _start_round(msgs, prog, rank, peers, group)
        task = rank_task(steps[i - 1], rank) if 1 <= i <= len(steps) else None
        if task is not None:
            prog.run(task)
        for msg, tensors in flight.wait().items():
            prog.receive(msg, tensors)


def dist_forward(
    q, k, v, kernel: AttnKernel, scale: float, causal: bool, group, documents: Documents | None = None,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Local contiguous shards q (b, s, h, d), k/v (b, s, h_kv, d) -> out (b, s, h, d), lse (b, h, s) fp32."""
    world, rank, peers, group = _group_info(group)
    prog = ForwardRank(q, k, v, kernel, scale, causal, documents, window)
    _drive(prog, world, rank, peers, group, causal, backward=False)
    return prog.result()


def dist_backward(dout, q, k, v, out, lse, kernel: AttnKernel, scale: float, causal: bool, group, documents=None,
                  window: int | None = None):  # fmt: skip
    """(dq, dk, dv) of :func:`dist_forward` given the final out/lse of the local queries."""
    world, rank, peers, group = _group_info(group)
    prog = BackwardRank(dout, q, k, v, out, lse, kernel, scale, causal, documents, window)
    _drive(prog, world, rank, peers, group, causal, backward=True)
    return prog.result()


def dist_flash_attention(
    q,
    k,
    v,
    kernel: AttnKernel,
    scale: float,
    causal: bool,
    group: dist.ProcessGroup,
    documents: Documents | None = None,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
):
    """Causal (or full) attention over the contiguously sharded sequence of ``group`` (DistFlashAttn).

    q: (batch, seq_local, heads, dim), k/v: (batch, seq_local, heads_kv, dim): rank r's contiguous chunk r
    (``extract_local('dist_flash_attn', ...)``, equal lengths on all ranks); returns q-shaped output.
    Inside a :func:`easy_context.core.attn_checkpoint.checkpoint_after_attention` layer the recompute reuses
    the forward's output instead of running attention again. ``documents``: document masking
    (:mod:`easy_context.core.documents`); ``window``: causal sliding window; ``sinks`` (heads,): attention sinks
    (docs/attention_variants.md).
    """
    return distributed_attention(NAME, dist_forward, dist_backward, q, k, v, kernel, scale, causal, group, documents,
                                 window=window, sinks=sinks)  # fmt: skip
