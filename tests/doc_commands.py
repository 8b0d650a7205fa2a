"""The shell commands of a README section, as argument lists, so tests run what the README prints.

A test takes a section's ```bash blocks, finds a command by its words, swaps the README's
placeholders (HEAD, fixed ports, /tmp folders) for its own loopback cluster's, and runs it:
the README and the test cannot drift apart.
"""

from __future__ import annotations

import re
import shlex

from conftest import REPO


def section_commands(heading: str, *, readme: str | None = None) -> list[list[str]]:
    """Every command of the ```bash blocks under the README heading `heading` (any level, up to
    the next heading of that level or higher): continuation lines joined, comments dropped,
    split as the shell splits words."""
    text = readme if readme is not None else (REPO / "README.md").read_text()
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, flags=re.M)
    assert m, f"README has no section {heading!r}"
    level = len(m.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[m.end():], flags=re.M)
    body = text[m.end():m.end() + end.start()] if end else text[m.end():]
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", body, flags=re.M | re.S):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def find(commands: list[list[str]], *words: str) -> list[str]:
    """The one command that begins with `words`."""
    found = [c for c in commands if c[:len(words)] == list(words)]
    assert len(found) == 1, f"expected one README command starting {' '.join(words)!r}, found {found}"
    return list(found[0])


def exports(commands: list[list[str]]) -> dict[str, str]:
    """The variables the README's `export NAME=value` lines set."""
    return dict(w.split("=", 1) for c in commands if c[0] == "export" for w in c[1:])


def substitute(command: list[str], replacements: dict[str, str]) -> list[str]:
    """`command` with each placeholder (e.g. 'HEAD:8265') replaced inside every word."""
    out = []
    for word in command:
        for old, new in replacements.items():
            word = word.replace(old, new)
        out.append(word)
    return out


def without_redirect(command: list[str]) -> list[str]:
    """`command` without a trailing `> FILE` (its output is captured by the test instead)."""
    return command[:command.index(">")] if ">" in command else command
