"""Every command the README and the docs pages show in a ```bash block is run by a test.

A command that starts with `trainlab`, `python -m trainlab`, `torchrun`, `ray job submit` or
`mlflow` must sit in a section of doc_commands.SECTIONS, the sections tests read through
section_commands, and have a runner below: the trainings (`trainlab train`, `trainlab submit`,
torchrun's `trainlab.train`, `ray job submit -- trainlab train`) are composed and validated here
with exactly their overrides, as `trainlab train` checks them before anything starts (a training
runs for minutes); `trainlab estimate` runs here for real (it starts nothing); the benches run in
tests/integration/test_bench_commands.py; the Ray job commands of the clusters page run in
tests/integration/test_multinode.py, on a loopback cluster started by that page's own commands.
"""

from __future__ import annotations

import re
import shlex

import pytest

from conftest import REPO
from doc_commands import CLUSTERS, HF, HF_PAGE, README, SECTIONS, section_commands

PAGES = [README, *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs" / "pages").rglob("*.md"))]
PREFIXES = (("trainlab",), ("python", "-m", "trainlab"), ("torchrun",), ("ray", "job", "submit"), ("mlflow",))
MULTINODE = "tests/integration/test_multinode.py"
BENCHES = "tests/integration/test_bench_commands.py"
HF_FLOW = "tests/integration/test_hf_flow.py"


def _words(command: list[str]) -> list[str]:
    """The command without leading `NAME=value` environment assignments."""
    i = 0
    while i < len(command) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", command[i]):
        i += 1
    return command[i:]


def _shown(page: str) -> list[list[str]]:
    """Every command of the page's ```bash blocks, split as section_commands splits them."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", (REPO / page).read_text(), flags=re.M | re.S):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def _checked(command: list[str]) -> bool:
    words = _words(command)
    return any(words[:len(p)] == list(p) for p in PREFIXES) or (
        words[:1] == ["python"] and len(words) > 2 and words[1] == "-m" and words[2].startswith("trainlab"))


def training_args(command: list[str]) -> list[str] | None:
    """The `trainlab train` arguments a training command amounts to; None if it is no training."""
    words = _words(command)
    if words[:2] == ["trainlab", "train"]:
        return words[2:]
    if words[:2] == ["trainlab", "submit"] and "--" in words:  # runs `trainlab train [-m] cluster=ray ...`
        cut = words.index("--")
        return [*(["-m"] if "-m" in words[:cut] else []), "cluster=ray", "cluster.address=auto", *words[cut + 1:]]
    if words[:1] == ["torchrun"] and "trainlab.train" in words:
        return words[words.index("trainlab.train") + 1:]
    if words[:3] == ["ray", "job", "submit"] and "--" in words:
        rest = words[words.index("--") + 1:]
        return rest[2:] if rest[:2] == ["trainlab", "train"] else None
    return None


def runner(command: list[str], section: tuple[str, str]) -> str | None:
    """The test that runs `command` (shown in `section`), or None."""
    words = _words(command)
    if section in (HF, HF_PAGE):  # made, swept and compared for real, in that order (their files)
        return HF_FLOW
    if words[:2] == ["trainlab", "bench"] or any(w.startswith("trainlab.bench.") for w in words):
        return BENCHES
    if words[:2] == ["trainlab", "estimate"]:
        return f"{__name__}::test_the_estimates_the_docs_show_run"
    if training_args(command) is not None:
        return f"{__name__}::test_the_trainings_the_docs_show_compose_and_validate"
    if section == CLUSTERS and words[:2] in (["trainlab", "status"], ["trainlab", "logs"], ["trainlab", "stop"]):
        return MULTINODE
    return None


def _registered() -> list[tuple[tuple[str, str], list[str]]]:
    return [(section, command) for section in SECTIONS for command in section_commands(section[1], page=section[0])]


def _of_kind(kind: str) -> list[tuple[str, list[str]]]:
    return [(f"{page}: {shlex.join(c)}", c) for (page, _), c in _registered()
            if _checked(c) and runner(c, (page, _)) and runner(c, (page, _)).endswith(kind)]


def test_every_command_the_docs_show_is_run_by_a_test():
    registered = _registered()
    missing = []
    for page in PAGES:
        for command in filter(_checked, _shown(page)):
            sections = [s for s, c in registered if s[0] == page and c == command]
            if not sections:
                missing.append(f"{page}: {shlex.join(command)}  (in no section of doc_commands.SECTIONS)")
            elif not any(runner(command, s) for s in sections):
                missing.append(f"{page}: {shlex.join(command)}  (no test runs this kind of command)")
    assert not missing, "commands the docs show that no test runs:\n" + "\n".join(missing)
    assert len({s for s, _ in registered}) == len(SECTIONS)  # every registered section has commands


def test_the_tests_that_run_the_docs_commands_read_them_from_the_docs():
    """The runners named above read the same sections (no copy of a command in a test)."""
    assert "section_commands(SECTION, page=PAGE)" in (REPO / MULTINODE).read_text()
    assert "PAGE, SECTION = CLUSTERS" in (REPO / MULTINODE).read_text()
    assert 'rglob("*.md")' in (REPO / BENCHES).read_text()
    assert "section_commands(HF[1], page=HF[0])" in (REPO / HF_FLOW).read_text()


def _params(kind: str) -> list:
    """One case per command; a multirun's (every job composed: 2-10 s each here) in the slow tier."""
    return [pytest.param(c, id=i, marks=[pytest.mark.slow] if "-m" in _words(c)[:3] else [])
            for i, c in _of_kind(kind)]


@pytest.mark.parametrize("command", _params("compose_and_validate"))
def test_the_trainings_the_docs_show_compose_and_validate(command):
    """Exactly the command's overrides, composed and validated as `trainlab train` checks them
    before launch (the plan's layout checks included): every job of a multirun."""
    from trainlab.config.multirun import expand_jobs
    from trainlab.plan.derive_layout import plan_layout

    jobs = expand_jobs(training_args(command), check=plan_layout)
    assert jobs and all(job.run.model.name for job in jobs)


@pytest.mark.parametrize("command", _params("show_run"))
def test_the_estimates_the_docs_show_run(command, capsys):
    """`trainlab estimate` as shown: it runs here (nothing starts) and prints a verdict per trial."""
    from trainlab.estimate_command import main

    main(_words(command)[2:])  # a refusal exits 2 (SystemExit fails the test)
    out = capsys.readouterr().out
    assert re.search(r"^(fits|does NOT fit)\b[^\n]*step [^\n]*tokens/s", out, flags=re.M), out[-3000:]
