"""Every `harness …` and `locust -f locustfiles/….py …` command line quoted in README.md
and docs/ parses: no option it names has been renamed or removed.

Command lines are taken from fenced code blocks; a backslash continues a line; shell
comments are dropped; synopsis lines (with `[optional] | alternatives`) are left out. A line
is parsed by the program's own parser (`harness.cli.build_parser`; Locust's parser with the
harness plugin's options), and fails the test only for what says the docs and the program
disagree — an unrecognized option, an invalid choice, an ambiguous abbreviation — not for a
placeholder value such as `PID` where a number goes.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DISAGREEMENT = re.compile(r"unrecognized arguments|invalid choice|ambiguous option")


def _fenced_lines(text: str) -> Iterator[str]:
    inside = False
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        yield line.removeprefix("$ ")


def command_lines() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for line in _fenced_lines(doc.read_text()):
            if not re.match(r"(harness [a-z][a-z-]*|locust -f locustfiles/\w+\.py)( |$)", line):
                continue
            if re.search(r" \[|\| |\.\.\.|…", line):
                continue  # a synopsis, not a command
            found.append((doc.name, line))
    return found


def _words(line: str) -> list[str]:
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        words = line.split()
    # a pipe, a redirection or a second command ends the harness's arguments
    for i, w in enumerate(words):
        if w in ("|", "&&", ";", ">", "2>", "&", "||"):
            return words[:i]
    return words


def _parse(parser, argv: list[str]) -> str:
    err = io.StringIO()
    with (
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.suppress(SystemExit),
    ):
        parser.parse_args(argv)
    return err.getvalue()


LINES = command_lines()


def test_the_docs_quote_commands_and_a_stale_option_is_caught():
    assert len(LINES) > 20, LINES  # the extraction finds the examples
    from harness.cli import build_parser

    stale = _parse(build_parser(), _words('harness tune --sut-cmd "x {port}" --quick'))
    assert DISAGREEMENT.search(stale), stale  # tune's hill climb is --hill-climb now


@pytest.mark.parametrize(("doc", "line"), LINES, ids=[f"{d}:{i}" for i, (d, _) in enumerate(LINES)])
def test_a_quoted_command_line_parses(doc: str, line: str):
    words = _words(line)
    if words[0] == "harness":
        from harness.cli import build_parser

        parser, argv = build_parser(), words[1:]
    else:
        from locust.argument_parser import get_parser

        import harness.load.plugin  # noqa: F401  (its options join Locust's parser)

        parser, argv = get_parser(), words[1:]
    problem = DISAGREEMENT.search(_parse(parser, argv))
    assert problem is None, f"{doc}: {line!r}: {_parse(parser, argv).strip()}"
