"""What ``swarm COMMAND --help`` ends with: an example and the command's documentation.

Each command's help is its one-line summary (the parser's ``help=``), its options, then::

    example:
      swarm submit --generate 200 --watch

    docs:
      docs/reference/cli.md#swarm-submit
      docs/tutorials/getting-started.md

The CLI reference (``docs/reference/cli.md``) is generated from the same parser
(``scripts/docgen.py``), so the help and the page say the same; a unit test checks that every
command has a summary, an example and a page that exists.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

#: the CLI reference page; a command's anchor on it is ``swarm-<words>`` (scripts/docgen.py)
CLI_PAGE = "docs/reference/cli.md"


@dataclass(frozen=True)
class CommandDocs:
    example: str
    #: the page a user reads to do what the command does (a tutorial, a how-to guide...)
    guide: str


#: Every command, by its words after ``swarm``.
COMMANDS: dict[tuple[str, ...], CommandDocs] = {
    ("sim",): CommandDocs("swarm sim lab61", "docs/explanation/planner.md"),
    ("sim", "lab61"): CommandDocs("swarm sim lab61", "docs/explanation/planner.md"),
    ("sim", "run"): CommandDocs(
        "swarm sim run --workers 200 --json", "docs/explanation/planner.md"
    ),
    ("sim", "sweep"): CommandDocs(
        "swarm sim sweep --plot sweep.png", "docs/explanation/planner.md"
    ),
    ("sim", "resume"): CommandDocs(
        "swarm sim resume --state run.json",
        "docs/explanation/planner.md",
    ),
    ("plan",): CommandDocs(
        "swarm plan --manifest units.json --usd-per-mtok 3", "docs/how-to/large-batches.md"
    ),
    ("submit",): CommandDocs(
        "swarm submit --generate 200 --watch", "docs/tutorials/getting-started.md"
    ),
    ("status",): CommandDocs("swarm status BATCH --watch", "docs/tutorials/getting-started.md"),
    ("resume",): CommandDocs(
        "swarm resume BATCH --top-up 2000000", "docs/how-to/budgets-and-tenants.md"
    ),
    ("rebind",): CommandDocs("swarm rebind acme", "docs/how-to/budgets-and-tenants.md"),
    ("approvals",): CommandDocs("swarm approvals BATCH --watch", "docs/agents.md"),
    ("approve",): CommandDocs(
        "swarm approve BATCH u-0001 tooluse-1 --reason 'checked the note'", "docs/agents.md"
    ),
    ("reject",): CommandDocs(
        "swarm reject BATCH u-0001 tooluse-1 --reason 'not that note'", "docs/agents.md"
    ),
    ("fleet",): CommandDocs(
        "swarm fleet --stack Swarm-prod", "docs/how-to/draining-and-deploying.md"
    ),
    ("drain",): CommandDocs("swarm drain on --wait", "docs/how-to/draining-and-deploying.md"),
    ("results",): CommandDocs(
        "swarm results BATCH --jsonl out.jsonl", "docs/tutorials/getting-started.md"
    ),
    ("judge",): CommandDocs("swarm judge BATCH", "docs/how-to/agents-and-tools.md"),
    ("deploy",): CommandDocs(
        "swarm deploy --stage prod --dry-run", "docs/how-to/draining-and-deploying.md"
    ),
    ("local",): CommandDocs("swarm local up", "docs/tutorials/getting-started.md"),
    ("local", "up"): CommandDocs("swarm local up", "docs/tutorials/getting-started.md"),
    ("local", "down"): CommandDocs("swarm local down", "docs/tutorials/getting-started.md"),
    ("local", "status"): CommandDocs("swarm local status --json", "docs/explanation/local.md"),
    ("local", "tenant"): CommandDocs("swarm local tenant acme", "docs/explanation/local.md"),
    ("local", "demo"): CommandDocs("swarm local demo", "docs/tutorials/getting-started.md"),
    ("bench",): CommandDocs("swarm bench cost --units 300", "docs/benchmarks/cost.md"),
    ("bench", "governor"): CommandDocs(
        "swarm bench governor --workers 20", "docs/benchmarks/governor.md"
    ),
    ("bench", "cost"): CommandDocs("swarm bench cost --units 300", "docs/benchmarks/cost.md"),
    ("smoke",): CommandDocs("swarm smoke --local", "docs/tutorials/first-deployment.md"),
}


def anchor(path: tuple[str, ...]) -> str:
    """A command's anchor on the CLI page: ``("sim", "run")`` -> ``swarm-sim-run``."""
    return "-".join(("swarm", *path))


def address(path: tuple[str, ...]) -> str:
    """A command's reference in the repository: ``docs/reference/cli.md#swarm-sim-run``."""
    return f"{CLI_PAGE}#{anchor(path)}"


class ParagraphFormatter(argparse.HelpFormatter):
    """argparse's formatter, but a blank line separates paragraphs and an indented line is
    kept as it is (an example), so an epilog reads as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks: list[str] = []
        for block in re.split(r"\n\s*\n", text.strip("\n")):
            if block.startswith(" ") or "\n " in block:
                blocks.append("\n".join(indent + line for line in block.splitlines()))
            else:
                blocks.append(super()._fill_text(block, width, indent))
        return "\n\n".join(blocks)


def subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """Every command under ``parser`` with its parser and its summary, in the parser's order."""
    found: list[tuple[tuple[str, ...], argparse.ArgumentParser, str]] = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, sub in action.choices.items():
            found.append(((*path, name), sub, summaries.get(name, "")))
            found.extend(subcommands(sub, (*path, name)))
    return found


def epilog(path: tuple[str, ...]) -> str:
    docs = COMMANDS[path]
    return f"example:\n  {docs.example}\n\ndocs:\n  {address(path)}\n  {docs.guide}"


def annotate(parser: argparse.ArgumentParser) -> None:
    """End every command's help with its example and its documentation's addresses.

    A command missing from :data:`COMMANDS` is a programming error (the unit test names it)."""
    parser.epilog = (
        "Run `swarm COMMAND --help` for a command's options, an example and its page.\n\n"
        "docs:\n  docs/index.md\n  docs/reference/cli.md (every command)"
    )
    if parser.formatter_class is argparse.HelpFormatter:
        parser.formatter_class = ParagraphFormatter
    for path, sub, _ in subcommands(parser):
        if path not in COMMANDS:
            continue
        own = f"{sub.epilog}\n\n" if sub.epilog else ""
        sub.epilog = own + epilog(path)
        if sub.formatter_class is argparse.HelpFormatter:
            sub.formatter_class = ParagraphFormatter
