"""Data loading under DP x SP: shard across data-parallel groups only (EasyContext's ``prepare_dataloader``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from easy_context.core.groups import get_dp_group, get_sp_group, init_sp_groups
from easy_context.core.registry import get_seq_algo


def prepare_dataloader(
    seq_algo: str,
    dataloader: DataLoader,
    accelerator,
    sp_size: int | None = None,
    check: bool = True,
    put_on_device: bool = True,
):
    """Wrap ``dataloader`` so every rank of an SP group sees the same batches and DP groups see different ones.

    ``data_parallel``: plain ``accelerator.prepare`` (every rank its own batches). SP modes: the batches are
    sharded over the ``world / sp_size`` DP groups (``sp_size=None``: one SP group, every rank the same data).
    With ``check`` the first batch's checksum is compared across the SP group (one tiny all-gather).
    ``put_on_device=False``: the batches stay on the host (a loop that shards them there first moves only this
    rank's shard to the device, once).
    """
    if not get_seq_algo(seq_algo).distributed:
        if put_on_device:
            return accelerator.prepare(dataloader)
        return accelerator.prepare_data_loader(dataloader, device_placement=False)
    from accelerate.data_loader import prepare_data_loader

    init_sp_groups(sp_size)
    dp_group = get_dp_group()
    dp_size = 1 if dp_group is None else dist.get_world_size(dp_group)
    dp_rank = 0 if dp_group is None else dist.get_rank(dp_group)
    loader = prepare_data_loader(
        dataloader, accelerator.device, num_processes=dp_size, process_index=dp_rank, put_on_device=put_on_device
    )
    return _SameBatchCheck(loader) if check else loader


def batch_checksum(batch) -> float:
    """A float summarising every tensor in a (possibly nested) batch."""
    if torch.is_tensor(batch):
        return float(batch.double().sum()) + 0.5 * batch.numel()
    if isinstance(batch, dict):
        return sum(batch_checksum(batch[k]) for k in sorted(batch))
    if isinstance(batch, (list, tuple)):
        return sum(batch_checksum(x) for x in batch)
    return 0.0


def assert_same_batch(batch, group=None) -> None:
    """Raise unless every rank of ``group`` (default: the SP group) holds the same batch."""
    group = get_sp_group() if group is None else group
    sums = [None] * dist.get_world_size(group)
    dist.all_gather_object(sums, batch_checksum(batch), group=group)
    if len(set(sums)) != 1:
        raise RuntimeError(
            f"ranks of one sequence-parallel group received different batches (checksums {sums}); shard data across "
            "data-parallel groups only (easy_context.prepare_dataloader)"
        )


class _SameBatchCheck:
    """Iterates a loader, checking the first batch of each epoch across the SP group."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if i == 0:
                assert_same_batch(batch)
            yield batch
