"""Bash completion for `trainlab train` through Hydra's own hook.

`eval "$(trainlab train -sc install=bash)"` installs Hydra 1.3's hook (core_plugins/
bash_completion.py). At a TAB the hook runs the line's first word with `-sc query=bash` and the
line in COMP_LINE: `trainlab -sc query=bash`, not `trainlab train ...`. Hydra then drops the app
name (one word) from COMP_LINE and reads the rest as overrides, so the `train` subcommand would
be taken for an override. Here the query is handed to the Hydra app of `trainlab train` with
`train` (or `estimate`, which takes train's overrides) taken out of COMP_LINE; a line still on
its subcommand word is answered with the subcommands, one on another subcommand with nothing
(bash then completes file names).
Nothing here imports Hydra: the hook runs this at every TAB.
"""

from __future__ import annotations

import os
import re
import sys

SHELL_COMPLETION_FLAGS = ("-sc", "--shell-completion")


def is_completion_call(args: list[str]) -> bool:
    """`-sc install=bash` / `-sc query=bash` (Hydra's flag), as the hook or a user gives it."""
    return bool(args) and args[0] in SHELL_COMPLETION_FLAGS


def hydra_argv(program: str, args: list[str], *, commands: list[str]) -> list[str]:
    """sys.argv for the Hydra app of `trainlab train ARGS` (Hydra parses sys.argv).

    Hydra names the app after sys.argv[0]: `trainlab train` in its help (`eval "$(trainlab train
    -sc install=bash)"`), but the hook it installs must be registered for the program alone
    (`complete ... trainlab`), or bash would also complete a command named `train`. `commands`:
    the subcommands a TAB on the subcommand word offers (trainlab.cli's table, in its order)."""
    if not any(a in SHELL_COMPLETION_FLAGS for a in args):
        return [f"{program} train", *args]
    if any(a.startswith("query=") for a in args):
        _retarget_query(commands)
    return [program, *args]


def _retarget_query(commands: list[str]) -> None:
    """COMP_LINE as Hydra's query reads it: `trainlab OVERRIDES`, the text up to the cursor.
    Exits (0) with the subcommands when the cursor is on the subcommand word, and with nothing
    when the line is another subcommand's."""
    line = os.environ.get("COMP_LINE")
    if line is None:
        print('error: -sc query=bash is what the completion hook runs, with the command line in '
              'COMP_LINE; install the hook instead: eval "$(trainlab train -sc install=bash)"',
              file=sys.stderr)
        sys.exit(2)
    point = os.environ.get("COMP_POINT", "")
    line = line[:int(point)] if point.isdigit() else line  # complete the word under the cursor
    words = line.split()
    cursor = len(words) if not line or line[-1].isspace() else len(words) - 1  # the word's index
    if cursor == 1:
        print("\n".join(commands))  # the hook keeps those that start with the word typed
        # (a line each: bash's compgen -W splits on newlines too, fish's hook reads lines)
        sys.exit(0)
    # `estimate` takes `train`'s overrides: the same Hydra app completes them
    train = re.match(r"(\s*\S+)\s+(?:train|estimate)(\s.*)$", line, re.S)
    if cursor == 0 or train is None:  # compare, bench, ...: argparse's flags, not Hydra's overrides
        sys.exit(0)
    line = train.group(1) + train.group(2)
    os.environ["COMP_LINE"], os.environ["COMP_POINT"] = line, str(len(line))
