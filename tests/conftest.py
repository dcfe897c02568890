import faulthandler
import os
import signal
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault(
    "HF_DATASETS_OFFLINE", "1"
)  # read when datasets imports: the zygote (tests/support/zygote.py) has it too

from tests.support import zygote  # noqa: E402
from tests.support.dist_pool import DistPool  # noqa: E402

# No test may hold the suite: past this many seconds a test fails with every thread's stack (SIGALRM), and a
# test stuck where Python cannot run (a C call holding the GIL) ends pytest with the stacks a minute later.
TEST_LIMIT_S = int(os.environ.get("EC_TEST_LIMIT", "900"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    def on_alarm(signum, frame):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        raise TimeoutError(f"{item.nodeid} ran past {TEST_LIMIT_S} s ($EC_TEST_LIMIT); its stacks are above")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_LIMIT_S)
    faulthandler.dump_traceback_later(TEST_LIMIT_S + 60, exit=True)
    try:
        yield
    finally:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


_POOLS: dict[int, DistPool] = {}


def get_pool(world_size: int) -> DistPool:
    pool = _POOLS.get(world_size)
    if pool is None or not pool.alive:
        pool = _POOLS[world_size] = DistPool(world_size)
    return pool


@pytest.fixture(scope="session")
def dist_pool():
    """``dist_pool(W)`` -> a live pool of W gloo ranks (started once per session and size)."""
    yield get_pool
    for pool in _POOLS.values():
        pool.close()


def pytest_sessionfinish(session, exitstatus):
    zygote.stop()
