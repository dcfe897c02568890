"""The peer tests' pass/fail table: ``python -m tests.peer.table [pytest args]`` runs tests/peer with the expected
failures off (``EC_PEER_RAW=1``: every test shows what it does today) and prints, per family, how many of the tests
run pass with transformers' attention and with easy_context's, then every test that passes with theirs and fails
with ours, grouped by cause (read from the error it raised)."""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

# (cause, pattern in the failure's message), first match wins
CAUSES = (
    ("shift_labels", r"shift_labels"),
    ("attention weights", r"output_attentions|attentions"),
    ("KV cache / generate", r"KV cache|past_key_values|seq_q == seq_k|generate|cache"),
    ("padding masks", r"padding attention_mask|attention mask reached"),
)


def cause(message: str) -> str:
    return next((name for name, pattern in CAUSES if re.search(pattern, message)), "other")


def outcomes(junit: Path) -> dict[tuple[str, str, str], tuple[str, str, int]]:
    """(family, side, test) -> (outcome, first line of the failure, calls of easy_context's attention)."""
    results = {}
    for case in ET.parse(junit).iter("testcase"):
        match = re.match(r"Test(\w+?)(Theirs|OursAllOnes|Ours)$", case.get("classname", "").rsplit(".", 1)[-1])
        if not match:
            continue
        outcome, message, calls = "passed", "", 0
        for child in case:
            if child.tag == "properties":
                calls = sum(int(p.get("value", 0)) for p in child if p.get("name") == "easy_context_attention_calls")
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "failed", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or "").splitlines()[0] if child.get("message") else ""
        results[(match[1].lower(), match[2].lower(), case.get("name"))] = (outcome, message, calls)
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.peer.table", description=__doc__)
    _, argv = parser.parse_known_args(argv)  # -h prints this; every other argument goes to pytest
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "peer.xml"
        env = {**os.environ, "EC_PEER_RAW": "1"}
        command = [
            sys.executable,
            "-m",
            "pytest",
            "tests/peer",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            "-o",
            "junit_family=xunit1",
            *argv,
        ]  # fmt: skip  (xunit1: record_property's calls reach the file)
        subprocess.run(command, env=env, stdout=subprocess.DEVNULL)
        results = outcomes(junit)
    families = sorted({family for family, _, _ in results})
    print("| family | run | theirs pass | ours pass | of them through easy_context's | ours fail (by cause) "
          "| all-ones masks: ours pass / through easy_context's |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    regressions = collections.defaultdict(list)
    for family in families:
        tests = sorted({t for f, _, t in results if f == family})
        count = collections.Counter()
        causes = collections.Counter()
        for test in tests:
            theirs, _, _ = results.get((family, "theirs", test), ("missing", "", 0))
            ours, message, calls = results.get((family, "ours", test), ("missing", "", 0))
            count["theirs " + theirs] += 1
            count["ours " + ours] += 1
            count["ours passed through ours"] += ours == "passed" and calls > 0
            ones, ones_message, ones_calls = results.get((family, "oursallones", test), ("missing", "", 0))
            count["ones " + ones] += 1
            count["ones passed through ours"] += ones == "passed" and ones_calls > 0
            if theirs == "passed" and ones not in ("passed", "missing"):
                regressions["all-ones masks: " + cause(ones_message)].append((family, test, ones_message[:160]))
            if ours == "passed" and calls == 0 and theirs == "passed":
                regressions["passes with transformers' attention kept (asked for by name)"].append((family, test, ""))
            if theirs == "failed":
                regressions["fails with transformers' attention (a tester defect)"].append((family, test, ""))
            if theirs == "passed" and ours != "passed":
                causes[cause(message)] += 1
                regressions[cause(message)].append((family, test, message[:160]))
        by_cause = ", ".join(f"{c} {n}" for c, n in causes.most_common()) or "-"
        run = len(tests) - count["theirs skipped"]  # a test skipped with their attention is not run
        through = count["ours passed through ours"]
        ones = f"{count['ones passed']} / {count['ones passed through ours']}"
        ones = "-" if count["ones missing"] == len(tests) else ones
        cells = [family, run, count["theirs passed"], count["ours passed"], through, by_cause, ones]
        print("| " + " | ".join(map(str, cells)) + " |")
    for name in sorted(regressions):
        print(f"\n## {name}")
        for family, test, message in regressions[name]:
            print(f"- {family}::{test}: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
