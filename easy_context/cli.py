"""The argparse parser every script uses: both spellings of each long flag, and the defaults in ``--help``.

    from easy_context import cli

    p = cli.ArgumentParser(description=__doc__)
    p.add_argument("--seq-length", type=int, default=16384, help="tokens per sequence")
    p.parse_args(["--seq_length", "8192"]).seq_length  # 8192: --seq-length and --seq_length are one flag

Each long option is registered with dashes and with underscores (one ``dest``: argparse's, from the first
spelling given); ``--help`` lists the spellings a script declares, with a note that the other one works too.
"""

from __future__ import annotations

import argparse
import os

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


def launched_rank() -> int | None:
    """This process's global rank when a launcher (torchrun, accelerate launch) started several, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


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
        """In a launched run every rank parses the same flags and fails the same way: rank 0 prints the one-line
        error (without the usage block, which the launcher's own report would bury), the other ranks exit quietly."""
        rank = launched_rank()
        if rank is None:
            super().error(message)
        if rank == 0:
            self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        self.exit(2)

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
