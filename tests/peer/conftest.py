"""The peer tests: transformers' own model tests over easy_context's attention (test_transformers_peer.py)."""

import os
from fnmatch import fnmatch

import pytest

from easy_context.hf.attention import attention_calls

# our stand-ins for modules of transformers' tests/ (hf_suite.py imports them); not test files of this suite
collect_ignore = ["hf_shim"]


def pytest_configure(config):
    # marks transformers' test_modeling_common puts on its tests (its own pytest config registers them)
    for mark in ("accelerate_tests", "flash_attn_test", "flash_attn_3_test", "flash_attn_4_test", "torch_compile_test"):
        config.addinivalue_line("markers", f"{mark}: transformers' test mark")


def pytest_collection_modifyitems(config, items):
    """A test in a case switched to easy_context's attention that matches the module's EXPECTED_FAILURES is a strict
    xfail with the table's reason: it must fail (a fix that makes it pass fails the run until the entry goes).
    ``EC_PEER_RAW=1`` leaves them unmarked, to see what each does today (tests/peer/table.py)."""
    if os.environ.get("EC_PEER_RAW") == "1":
        return
    for item in items:
        table = getattr(item.module, "EXPECTED_FAILURES", None)
        case = getattr(item, "cls", None)
        if table is None or getattr(case, "attention", None) != "ours":
            continue
        key = f"{case.family.name}::{item.name}"
        for pattern, reason in table.items():
            if fnmatch(key, pattern):
                item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
                break


@pytest.fixture(autouse=True)
def _easy_context_attention_calls(request, record_property):
    """How many times easy_context's attention ran in the test (a junit property tests/peer/table.py reads): a test
    that asks for transformers' attention by name (attn_implementation="eager") keeps it on one process, so its pass
    says nothing about ours."""
    before = attention_calls()
    yield
    record_property("easy_context_attention_calls", attention_calls() - before)
