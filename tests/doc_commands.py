"""The shell commands of a README or docs page section, as argument lists, so tests run what the docs print.

A test takes a section's ```bash blocks, finds a command by its words, swaps the page's
placeholders (HEAD, fixed ports, /tmp folders) for its own loopback cluster's, and runs it:
the docs and the test cannot drift apart. SECTIONS lists every (page, heading) whose commands
tests run; tests/unit/test_doc_commands.py fails for a command shown anywhere else.
"""

from __future__ import annotations

import re
import shlex

from conftest import REPO

README = "README.md"
SWEEPS = ("docs/pages/sweeps.md", "Sweeps")
PRECISION = ("docs/pages/precision.md", "Precision lab: FP8, emulated formats, stability")
PARALLEL = ("docs/pages/parallel.md", "Parallelism")
CLUSTERS = ("docs/pages/clusters.md", "Clusters of mixed GPUs")
"""The page tests/integration/test_multinode.py starts its cluster from and runs the Ray commands of."""
ESTIMATES = ("docs/pages/estimates.md", "Know before you run: estimates")
FAULTS = ("docs/pages/faults.md", "Faults: checkpoints, restarts, outages, bad input")
USING = (README, "Using it")
HF = (README, "Your model and your data")
HF_PAGE = ("docs/pages/huggingface.md", "Your model and your data")
"""The three commands tests/integration/test_hf_flow.py runs, as the README and the page show them."""
SECTIONS = (USING, SWEEPS, PRECISION, PARALLEL, CLUSTERS, ESTIMATES, FAULTS, HF, HF_PAGE)
"""Every (page, heading) whose ```bash commands tests run: test_doc_commands.py runs (or, for a
training, composes and validates) each trainlab/torchrun command of each, test_bench_commands.py
each bench they name, test_multinode.py the Ray and job commands of CLUSTERS."""


def section_commands(heading: str, *, page: str = README, text: str | None = None) -> list[list[str]]:
    """Every command of the ```bash blocks under the heading `heading` of `page` (a path from the
    repository root; any heading level, up to the next heading of that level or higher):
    continuation lines joined, comments dropped, split as the shell splits words."""
    text = text if text is not None else (REPO / page).read_text()
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, flags=re.M)
    assert m, f"{page} has no section {heading!r}"
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
    assert len(found) == 1, f"expected one command starting {' '.join(words)!r}, found {found}"
    return list(found[0])


def exports(commands: list[list[str]]) -> dict[str, str]:
    """The variables the page's `export NAME=value` lines set."""
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
