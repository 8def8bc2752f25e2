"""The README's command lines use flags the commands have: a flag renamed in the CLI and not
in the README (`--profile` for `--device-profile`) fails here."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from wallfinder.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
INVOKE = re.compile(r"(?:^|[\s(])(?:[\w./-]*/)?wallfinder\s+([a-z]+)\b(.*)")
"""A `wallfinder COMMAND ...` invocation (also as `.venv/bin/wallfinder`) and what follows."""
END = re.compile(r"\s--(?:\s|$)|#|\||>")
"""Where a command's own flags end: `--` (run's program and its arguments), a comment, a
pipe or a redirection."""
NCU_FLAGS = {
    "--kernel-name",
    "--launch-count",
    "--launch-skip",
    "--page",
    "--print-kernel-base",
    "--print-summary",
}
"""Nsight Compute's own flags, which the counters section names alone in backticks."""


def _options() -> tuple[dict[str, set[str]], set[str]]:
    """Each command's option strings, and the top level's."""
    parser = build_parser()
    top: set[str] = set()
    commands: dict[str, set[str]] = {}
    for action in parser._actions:
        top.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                commands[name] = {o for a in sub._actions for o in a.option_strings}
    return commands, top


def _code() -> list[str]:
    """Every line of the README's code blocks and every inline code span (one line each)."""
    text = README.read_text(encoding="utf-8")
    fenced = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    lines = [line for block in fenced.findall(text) for line in block.splitlines()]
    prose = fenced.sub("", text)
    return lines + [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]


def unknown_flags(lines: list[str]) -> list[str]:
    """The flags `lines` (code lines and spans) pass to a wallfinder command that lacks them,
    or name alone where no command has them."""
    commands, top = _options()
    every = top.union(*commands.values())
    out = []
    for line in lines:
        call = INVOKE.search(line)
        if call is not None and call[1] in commands:
            known = commands[call[1]] | top
            flags = FLAG.findall(END.split(call[2])[0])
            out += [f"wallfinder {call[1]} {f}: {line.strip()}" for f in flags if f not in known]
        elif call is None and line.strip().startswith("--"):
            # A flag named alone in the prose: some command must have it.
            flag = FLAG.findall(line)[0]
            if flag not in every | NCU_FLAGS:
                out.append(f"{flag}: {line.strip()}")
    return out


def test_every_flag_the_readme_names_is_a_flag_of_its_command() -> None:
    assert unknown_flags(_code()) == []


def test_a_flag_its_command_lacks_is_found_and_other_programs_flags_are_not() -> None:
    lines = [
        "wallfinder analyze trace.json --profile h100.json   # the README's old name",
        "--profile",  # a span naming a flag alone
        "wallfinder roofline --device h100 --counters k.csv",  # analyze's flag, not roofline's
        "wallfinder analyze trace.json --device-profile h100.json --counters k.csv",
        "wallfinder run -- python train.py --lr 3e-4",  # the program's own flags
        "ncu --page raw --csv ./app > k.csv",
        "--page raw",
    ]
    assert unknown_flags(lines) == [
        "wallfinder analyze --profile: " + lines[0],
        "--profile: --profile",
        "wallfinder roofline --counters: " + lines[2],
    ]
