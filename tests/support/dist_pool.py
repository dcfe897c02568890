"""A pool of W spawned CPU processes joined in a gloo process group, reused across tests.

``pool.run(fn, *args)`` calls ``fn(rank, world_size, *args)`` on every rank and returns the per-rank
results (an exception on any rank is re-raised here with its traceback). A call that does not finish
within the timeout kills the pool (so a hang fails the test instead of blocking the suite).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import socket
import traceback

TIMEOUT_S = float(os.environ.get("EC_TEST_TIMEOUT", "120"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, tasks, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args = task
        try:
            results.put((rank, True, fn(rank, world, *args)))
        except BaseException as exc:  # report, keep serving
            results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    dist.destroy_process_group()


class RemoteError(RuntimeError):
    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank}: {message}")
        self.rank, self.message = rank, message


class DistPool:
    def __init__(self, world_size: int):
        self.world_size = world_size
        ctx = mp.get_context("spawn")
        port = _free_port()
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        self.procs = [
            ctx.Process(target=_worker, args=(r, world_size, port, self.tasks[r], self.results), daemon=True)
            for r in range(world_size)
        ]
        for p in self.procs:
            p.start()

    def run(self, fn, *args, timeout: float = TIMEOUT_S) -> list:
        """Run ``fn(rank, world_size, *args)`` on all ranks; return results in rank order."""
        for q in self.tasks:
            q.put((fn, args))
        out: dict[int, object] = {}
        errors: list[RemoteError] = []
        for _ in range(self.world_size):
            try:
                rank, ok, value = self.results.get(timeout=timeout)
            except queue.Empty:
                self.close(force=True)
                raise TimeoutError(f"distributed call {fn.__name__} did not finish in {timeout}s (hang?)") from None
            if ok:
                out[rank] = value
            else:
                errors.append(RemoteError(rank, value))
        if errors:
            raise errors[0]
        return [out[r] for r in range(self.world_size)]

    @property
    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def close(self, force: bool = False) -> None:
        if not force:
            for q in self.tasks:
                q.put(None)
            for p in self.procs:
                p.join(timeout=10)
        for p in self.procs:
            if p.is_alive():
                p.kill()
