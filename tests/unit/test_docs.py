"""The documentation users rely on stays true: every command's help leads to a page that exists,
the generated reference pages match their sources, and every link into docs/ resolves."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path
from types import ModuleType

import pytest

from swarm.cli import build_parser
from swarm.cli.helpdocs import COMMANDS, anchor, subcommands

ROOT = Path(__file__).resolve().parents[2]


def _docgen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docgen", ROOT / "scripts" / "docgen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMMAND_PATHS = [path for path, _, _ in subcommands(build_parser())]


def test_every_command_is_documented_and_nothing_else() -> None:
    assert len(COMMAND_PATHS) > 20, "the walk found too few commands: is the parser walked?"
    assert set(COMMAND_PATHS) == set(COMMANDS), (
        f"commands without docs: {sorted(set(COMMAND_PATHS) - set(COMMANDS))}; "
        f"docs of no command: {sorted(set(COMMANDS) - set(COMMAND_PATHS))} (swarm/cli/helpdocs.py)"
    )


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=" ".join)
def test_a_commands_help_has_a_summary_an_example_and_pages_that_exist(
    path: tuple[str, ...],
) -> None:
    # Given the command's parser, as `swarm ... --help` prints it
    found = {p: (sub, summary) for p, sub, summary in subcommands(build_parser())}
    sub, summary = found[path]
    text = sub.format_help()

    # Then its one-line summary is given (the line `swarm --help` lists it with)
    assert summary.strip() and "\n" not in summary.strip(), f"{path}: no one-line summary"
    # and its help ends with an example that the parser itself accepts
    match = re.search(r"^example:\n  (swarm .+)$", text, re.MULTILINE)
    assert match is not None, f"{path}: no example in its help:\n{text}"
    words = shlex.split(match.group(1))
    assert tuple(words[1 : 1 + len(path)]) == path, f"{path}: the example runs another command"
    build_parser().parse_args(words[1:])  # exits (status 2) on an example the parser refuses
    # and with its pages: the CLI reference's anchor, and the guide, both in the repository
    pages = re.search(r"^docs:\n((?:  \S+\n?)+)", text, re.MULTILINE)
    assert pages is not None, f"{path}: no docs in its help:\n{text}"
    addresses = pages.group(1).split()
    assert f"docs/reference/cli.md#{anchor(path)}" in addresses
    for address in addresses:
        page, _, fragment = address.partition("#")
        assert (ROOT / page).is_file(), f"{path}: {page} does not exist"
        if fragment:
            assert f"{{#{fragment}}}" in (ROOT / page).read_text(), f"{address}: no such anchor"


@pytest.mark.parametrize(
    "page", ["docs/reference/cli.md", "docs/reference/api.md", "docs/reference/config.md"]
)
def test_generated_reference_pages_are_current(page: str) -> None:
    docgen = _docgen()
    expected = docgen.PAGES[page]()
    assert (ROOT / page).read_text() == expected, (
        f"{page} is stale: run `make docs-gen` (scripts/docgen.py) and commit it"
    )


def test_the_cli_reference_does_not_depend_on_argparse_help_formatting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """argparse's help layout differs between Python versions (usage wrapping, how an option's
    value is shown) and terminal widths: the page is built from the parser's actions, so a
    different help formatter, or width, gives the same page and `make docs` stays current."""
    docgen = _docgen()
    expected = docgen.cli_page()
    import argparse

    monkeypatch.setattr(argparse.HelpFormatter, "format_help", lambda self: "other layout\n")
    monkeypatch.setenv("COLUMNS", "40")
    assert docgen.cli_page() == expected
    # and it still says what each command takes: an option, its value and its help
    row = next(line for line in expected.splitlines() if "<code>--turns N&#124;A-B</code>" in line)
    assert "model turns per unit" in row


def test_the_config_reference_lists_every_shipped_cdk_json_key() -> None:
    import json

    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    ours = [key for key in context if not key.startswith("@") and key != "cli-telemetry"]
    missing = [key for key in ours if f"| `{key}` |" not in page]
    assert not missing, f"cdk.json keys missing from docs/reference/config.md: {missing}"
    # a nested key with its range and comment, as a reader looks it up
    row = next(
        line for line in page.splitlines() if line.startswith("| `fanout.timeout_seconds` |")
    )
    assert ">= 3, <= 300" in row and "`30`" in row and "Express" in row


LINK = re.compile(r"\bdocs/[\w./-]+\.(?:md|json)")


def test_every_docs_path_named_in_code_and_tests_exists() -> None:
    # comments and messages send readers to docs/<page>.md: each must exist
    missing: dict[str, list[str]] = {}
    for package in ("swarm", "infra", "functions", "tests", "scripts"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in LINK.findall(path.read_text()):
                if not (ROOT / name).is_file():
                    missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"links to pages that do not exist: {missing}"


FENCE = re.compile(r"```bash\n(.*?)```", re.DOTALL)
PAGES_WITH_COMMANDS = [
    "README.md",
    "docs/tutorials/getting-started.md",
    "docs/how-to/draining-and-deploying.md",
    "docs/how-to/budgets-and-tenants.md",
    "docs/how-to/agents-and-tools.md",
    "docs/how-to/large-batches.md",
]


def _commands(page: str) -> list[str]:
    found: list[str] = []
    for block in FENCE.findall((ROOT / page).read_text()):
        for line in block.splitlines():
            command = line.split("  #", 1)[0].strip()
            if command:
                found.append(command)
    return found


@pytest.mark.parametrize("page", PAGES_WITH_COMMANDS)
def test_the_commands_a_page_shows_are_accepted_as_written(page: str) -> None:
    # Given every command in the page's bash blocks (the e2e tier runs the swarm commands)
    commands = _commands(page)
    assert commands, f"{page}: no bash block found"
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    for command in commands:
        words = shlex.split(command)
        if words[0] == ".venv/bin/swarm":
            # Then the parser takes each swarm command (a batch id stands for one)
            build_parser().parse_args(words[1:])
        elif words[0] == "make":
            # and each make target exists
            assert words[1] in targets, f"{page}: {command}: no such make target"


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "README.md: at most ~150 lines; move detail to docs/"
    # the two commands, as CI runs them (.ci/run)
    assert "make run" in readme and "make test" in readme
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.(?:md|json))(?:#[\w-]+)?\)", readme):
        assert (ROOT / link).is_file(), f"README.md links to {link}, which does not exist"


def test_the_version_is_one_semver_in_pyproject_the_package_and_the_changelog() -> None:
    """The wheel's version (pyproject.toml), ``swarm.__version__`` and the newest released
    section of CHANGELOG.md are one Semantic Versioning version."""
    import tomllib

    import swarm

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    assert swarm.__version__ == version
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert released and released[0] == version, (released[:1], version)
