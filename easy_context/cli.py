"""The argparse parser every script uses: both spellings of each long flag, and the defaults in ``--help``.

    from easy_context import cli

    p = cli.ArgumentParser(description=__doc__)
    p.add_argument("--seq-length", type=int, default=16384, help="tokens per sequence")
    p.parse_args(["--seq_length", "8192"]).seq_length  # 8192: --seq-length and --seq_length are one flag

Each long option is registered with dashes and with underscores (one ``dest``: argparse's, from the first
spelling given); ``--help`` lists the spellings a script declares, with a note that the other one works too.
A bad value is one line and exit code 2; the numeric types below (``positive_int``, ``non_negative_int``,
``positive_float``, ``non_negative_float``, ``fraction``, ``decay_rate``) refuse what a flag cannot mean:

    p.add_argument("--batch-size", type=cli.positive_int, default=1)   # --batch-size 0: "must be an integer >= 1"
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from typing import NoReturn

SPELLING_NOTE = "Every --long-flag is also accepted with underscores (--seq_length = --seq-length), and vice versa."


def other_spellings(option_string: str) -> list[str]:
    """``--seq-length`` -> ``["--seq_length"]``; ``--a-b_c`` -> both uniform spellings; short options: none."""
    if not option_string.startswith("--") or len(option_string) <= 2:
        return []
    body = option_string[2:]
    spellings = ["--" + body.replace("_", "-"), "--" + body.replace("-", "_")]
    return [s for i, s in enumerate(spellings) if s != option_string and s not in spellings[:i]]


def _add_argument(container, add, args, kwargs):
    """``add(*args, **kwargs)`` with the other spelling of each long option appended (unless already taken)."""
    if not args or not args[0] or args[0][0] not in container.prefix_chars:  # a positional
        return add(*args, **kwargs)
    taken = container._option_string_actions
    extra = []
    for s in args:
        extra += [o for o in other_spellings(s) if o not in args and o not in extra and o not in taken]
    action = add(*args, *extra, **kwargs)
    hidden = set(extra) | {"--no-" + o[2:] for o in extra}  # and BooleanOptionalAction's negations of them
    action.shown_option_strings = [o for o in action.option_strings if o not in hidden]
    return action


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Description and epilog as written; "(default: X)" after the help of a flag with a meaningful default."""

    def _get_help_string(self, action):
        help = action.help or ""
        default = action.default
        if (
            "%(default)" in help
            or "(default" in help  # the help states it already, in its own words
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or (not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
        ):
            return help
        if isinstance(default, (list, tuple)):
            shown = " ".join(str(v) for v in default).replace("%", "%%")
            return f"{help} (default: {shown})" if help else f"(default: {shown})"
        return f"{help} (default: %(default)s)" if help else "(default: %(default)s)"

    def _format_action_invocation(self, action):
        """``--seq-length, --seq_length N`` (the metavar once), and only the spellings the script declared."""
        if not action.option_strings:
            return super()._format_action_invocation(action)
        shown = ", ".join(getattr(action, "shown_option_strings", action.option_strings))
        if action.nargs == 0:
            return shown
        return f"{shown} {self._format_args(action, self._get_default_metavar_for_optional(action))}"


def _number(kind: type, text: str, rule: str, ok: Callable[[float], bool]) -> int | float:
    """``kind(text)`` when it is a finite number that passes ``ok``; else argparse's error naming the rule."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {rule}, got {text!r}") from None
    if not (math.isfinite(value) and ok(value)):  # NaN fails every comparison: refused here too
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a count, a length, a step number)."""
    return _number(int, text, "an integer >= 1", lambda v: v >= 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (where 0 means "off" or "none", or a seed)."""
    return _number(int, text, "an integer >= 0", lambda v: v >= 0)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (a learning rate, a RoPE base)."""
    return _number(float, text, "a number > 0", lambda v: v > 0)


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (where 0 means "off")."""
    return _number(float, text, "a number >= 0", lambda v: v >= 0)


def fraction(text: str) -> float:
    """argparse type: a number in (0, 1] (a share of something: a step of 0 would never advance)."""
    return _number(float, text, "a number in (0, 1]", lambda v: 0 < v <= 1)


def decay_rate(text: str) -> float:
    """argparse type: a number in [0, 1) (Adam's betas: 1 would never forget, the moments' bias correction divides
    by zero)."""
    return _number(float, text, "a number in [0, 1)", lambda v: 0 <= v < 1)


def retype(parser: argparse.ArgumentParser, **types: Callable[[str], object]) -> None:
    """Give flags declared elsewhere (a shared helper's) a checking type, by dest: ``retype(p, seed=positive_int)``."""
    for action in parser._actions:
        if action.dest in types:
            action.type = types.pop(action.dest)
    if types:
        raise ValueError(f"no flags with dest {sorted(types)}")


# A hub repo id: [org/]name of letters, digits, "-", "_", "." (no "--" or "..", no leading or trailing "-" or "."),
# at most 96 characters a part (huggingface_hub's validate_repo_id).


# Folder names that training runs write to: ``out/llama2-64k`` names a run's output, not user "out"'s model.


def launched_rank() -> int | None:
    """This process's global rank when a launcher (torchrun, accelerate launch) started several, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


# the launcher stops every rank once the first one exits: the quiet ranks wait this long, so that rank 0 is not
# stopped before it printed the line
QUIET_EXIT_DELAY_S = 3.0


def exit_quietly(code: int) -> NoReturn:
    """A launched rank other than 0 ends with ``code`` and prints nothing (rank 0 prints the refusal), a moment
    later than rank 0 (:data:`QUIET_EXIT_DELAY_S`)."""
    time.sleep(QUIET_EXIT_DELAY_S)
    sys.exit(code)


def refuse(message: str) -> NoReturn:
    """Exit with the one-line ``message`` (exit code 1) for a refusal every rank of a launched job reaches alike (a
    flag, a layout): only rank 0 prints it, so it comes once (:func:`exit_quietly`)."""
    if launched_rank() in (None, 0):
        sys.exit(message)
    exit_quietly(1)


class ArgumentParser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` with both spellings of each long flag and defaults shown in ``--help``."""

    def __init__(self, *args, formatter_class=HelpFormatter, epilog: str | None = None, **kwargs):
        epilog = f"{epilog}\n\n{SPELLING_NOTE}" if epilog else SPELLING_NOTE
        super().__init__(*args, formatter_class=formatter_class, epilog=epilog, **kwargs)

    def add_argument(self, *args, **kwargs):
        return _add_argument(self, super().add_argument, args, kwargs)

    def add_argument_group(self, *args, **kwargs):
        return _both_spellings(super().add_argument_group(*args, **kwargs))

    def add_mutually_exclusive_group(self, *args, **kwargs):
        return _both_spellings(super().add_mutually_exclusive_group(*args, **kwargs))

    def error(self, message: str):
        """One line, exit code 2: ``prog: error: message (see prog --help)``, without the usage block (train.py's is
        40 lines, and it would bury the error). In a launched run every rank parses the same flags and fails the same
        way: rank 0 prints the line, the other ranks exit quietly."""
        for action in self._actions:  # argparse names a flag by all its spellings: the first one is enough
            names = getattr(action, "shown_option_strings", None) or action.option_strings
            if len(action.option_strings) > 1:
                message = message.replace(f"argument {'/'.join(action.option_strings)}:", f"argument {names[0]}:")
        if launched_rank() in (None, 0):
            self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        exit_quietly(2)

    def _get_option_tuples(self, option_string):
        """An abbreviation matching both spellings of one flag (``--learning`` -> ``--learning-rate``) is no
        ambiguity: keep one match per action."""
        result, seen = [], set()
        for tup in super()._get_option_tuples(option_string):
            if id(tup[0]) not in seen:
                seen.add(id(tup[0]))
                result.append(tup)
        return result


def _both_spellings(group):
    """A group of an :class:`ArgumentParser` whose ``add_argument`` (and sub-groups) register both spellings."""
    add = group.add_argument
    group.add_argument = lambda *args, **kwargs: _add_argument(group, add, args, kwargs)
    if hasattr(group, "add_mutually_exclusive_group"):
        add_mx = group.add_mutually_exclusive_group
        group.add_mutually_exclusive_group = lambda *args, **kwargs: _both_spellings(add_mx(*args, **kwargs))
    return group
