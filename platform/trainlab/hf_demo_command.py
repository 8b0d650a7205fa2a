"""`trainlab hf-demo DIR`: a tiny local Hugging Face model, its tokenizer and datasets, made here.

    trainlab hf-demo hf_demo                  # hf_demo/model (tokenizer inside), hf_demo/data
    trainlab hf-demo hf_demo --family qwen2

What the README's "your model and your data" commands train on when you have none of your own:
a BPE tokenizer trained on the embedded corpus, a 2-layer model of width 64 with that vocabulary
saved by transformers' save_pretrained (its weights a seeded random init: fine-tuning it is
pre-training a tiny model), and the corpus as a jsonl of documents and one of chat turns.
Nothing downloads; it takes a few seconds.

DIR must be new or an empty folder; nothing already there is changed. The demo is made in a
temporary folder beside DIR (`.NAME.hf-demo-XXXX`, on the same filesystem) and renamed into place
at the end: a run that fails, or is stopped (Ctrl-C, SIGTERM, SIGHUP: one line, exit 128 + the
signal), removes that folder and the parents it made, so the same command works next time. A
SIGKILL can leave the hidden folder behind; it never blocks a run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterator

from trainlab.config.hf_model import HF_FAMILIES, TESTED_OTHER_FAMILIES
from trainlab.config.schema import SEED_MAX, SEED_WHY
from trainlab.events import STOP_SIGNALS

FIX = "name a new folder, e.g. trainlab hf-demo hf_demo"
WRITABLE = "name a new folder in one you can write, e.g. trainlab hf-demo ~/hf_demo"
PARTS = ("model", "data")
"""What make_demo puts in DIR."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        print(f"error: trainlab hf-demo: {message}; see trainlab hf-demo --help", file=sys.stderr)
        sys.exit(2)


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number from 0 to {SEED_MAX} "
                                         f"({SEED_WHY}); pass e.g. --seed 0")
    return value


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="trainlab hf-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("out", metavar="DIR", help="folder to write (model/ and data/ inside); must be new or empty")
    p.add_argument("--family", default="llama", choices=(*HF_FAMILIES, *TESTED_OTHER_FAMILIES),
                   help="the model's architecture")
    p.add_argument("--seed", type=_seed, default=0, help=f"seed of the model's random weights (0 to {SEED_MAX})")
    return p


# ---- DIR: checked, made beside, renamed into place --------------------------------------------
def _where(out) -> str:
    return f"hf-demo DIR {str(out)!r}"


def check_out(out: Path) -> bool:
    """ValueError naming DIR unless `out` is new or an empty folder (or a link to one): what
    make_demo may fill. Returns whether it exists."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return False  # a parent is a file: _Staging names it
    except (OSError, ValueError) as e:  # too long, unreadable parent, a NUL in it
        raise ValueError(f"{_where(out)} cannot be used ({getattr(e, 'strerror', None) or e}); {FIX}") from None
    if stat.S_ISLNK(st.st_mode) and not os.path.exists(out):
        raise ValueError(f"{_where(out)} is a symbolic link to {os.readlink(out)!r}, which does not exist; "
                         f"make the folder it points to, or {FIX}")
    if not os.path.isdir(out):
        what = "a file" if stat.S_ISREG(os.stat(out).st_mode) else "not a folder"
        raise ValueError(f"{_where(out)} exists and is {what}; nothing in it is changed: {FIX}")
    try:
        entries = sorted(os.listdir(out))
    except OSError as e:
        raise ValueError(f"{_where(out)} cannot be listed ({e.strerror or e}); {FIX}") from None
    if entries:
        count = f"{len(entries)} {'entry' if len(entries) == 1 else 'entries'}, e.g. {entries[0]!r}"
        raise ValueError(f"{_where(out)} exists and is not empty ({count}); nothing in it is changed: {FIX}")
    return True


class _Staging:
    """The temporary folder beside DIR that the demo is made in, and DIR's missing parents made
    for it. publish() renames it into place; discard() removes only what this made."""

    def __init__(self, out: Path):
        self.out = out
        self.existed = check_out(out)
        # an existing DIR (maybe a link to a folder elsewhere) is filled where it really is
        self.target = Path(os.path.realpath(out)) if self.existed else Path(os.path.abspath(out))
        self.made: list[Path] = []  # parents, outermost first
        self.temp: Path | None = None
        self.published = False

    def prepare(self) -> Path:
        """Make the missing parents and the temporary folder (ValueError naming DIR where one
        cannot be made); returns the temporary folder."""
        parent = self.target.parent
        missing = []
        while not os.path.lexists(parent):
            missing.insert(0, parent)
            parent = parent.parent
        if not os.path.isdir(parent):
            raise ValueError(f"{_where(self.out)}: {str(parent)!r} is not a folder; {FIX}")
        for folder in missing:
            try:
                folder.mkdir()
            except OSError as e:
                raise ValueError(f"{_where(self.out)}: cannot make the folder {str(folder)!r} "
                                 f"({e.strerror or e}); {WRITABLE}") from None
            self.made.append(folder)
        try:
            self.temp = Path(tempfile.mkdtemp(prefix=f".{self.target.name[:64]}.hf-demo-",
                                              dir=self.target.parent))
        except OSError as e:
            raise ValueError(f"{_where(self.out)}: cannot make a folder in {str(self.target.parent)!r} "
                             f"({e.strerror or e}); {WRITABLE}") from None
        return self.temp

    def publish(self) -> None:
        """Rename the demo into place: a new DIR appears whole in one rename; an existing empty
        one gets model/ and data/ (moved back if the second cannot go). Never replaces anything."""
        assert self.temp is not None
        if not self.existed:
            if os.path.lexists(self.target):
                raise ValueError(f"{_where(self.out)} was made by something else while the demo was "
                                 f"made; nothing in it is changed: {FIX}")
            os.rename(self.temp, self.target)
        else:
            moved = []
            try:
                for part in PARTS:
                    if os.path.lexists(self.target / part):
                        raise ValueError(f"{_where(self.out)}: {part!r} was put in it while the demo "
                                         f"was made; nothing in it is changed: {FIX}")
                    os.rename(self.temp / part, self.target / part)
                    moved.append(part)
            except BaseException:
                for part in moved:
                    os.rename(self.target / part, self.temp / part)
                raise
            os.rmdir(self.temp)
        self.published = True

    def discard(self) -> None:
        """Remove the temporary folder and the parents made for it (those still empty)."""
        if self.temp is not None and not self.published:
            shutil.rmtree(self.temp, ignore_errors=True)
        for folder in reversed(self.made if not self.published else []):
            try:
                folder.rmdir()
            except OSError:
                break  # something else is in it now: leave it


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Stop signals that come inside the block are let go: a rename into place or a cleanup
    finishes whole (half of one would leave a half-made DIR behind), and takes microseconds."""
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            if signal.getsignal(s) not in (signal.SIG_IGN, None):
                saved[s] = signal.signal(s, lambda _signum, _frame: None)
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def make_demo(out: Path, *, family: str = "llama", seed: int = 0,
              say: Callable[[str], None] = lambda _line: None) -> dict[str, Path]:
    """Write the demo to `out` (new, or an empty folder); returns its paths (model, docs, chat).
    ValueError naming DIR before anything is made where it cannot be; on any failure or stop
    signal nothing is left behind."""
    staging = _Staging(out)
    try:
        temp = staging.prepare()
        say(f"making a {family} demo model, tokenizer and datasets in {out} ...")
        _build(temp, family=family, seed=seed, say=say)
        with _signals_held():  # done: a signal now would only make a user run it again
            staging.publish()
    except BaseException:
        with _signals_held():  # a second Ctrl-C must not leave half the folder behind
            staging.discard()
        raise
    return {"model": out / "model", "docs": out / "data" / "docs.jsonl", "chat": out / "data" / "chat.jsonl"}


def _build(folder: Path, *, family: str, seed: int, say: Callable[[str], None]) -> None:
    """The tokenizer and model in folder/model, the datasets in folder/data."""
    say("  tokenizer (a byte-level BPE trained on the embedded corpus) ...")
    from trainlab.data.hf_demo import train_demo_tokenizer, write_demo_dataset

    train_demo_tokenizer(folder / "model")
    say("  model (transformers' save_pretrained) ...")
    from transformers import AutoTokenizer

    from trainlab.models.hf_demo import write_demo_model

    vocab_size = len(AutoTokenizer.from_pretrained(folder / "model", local_files_only=True,
                                                  trust_remote_code=False))
    write_demo_model(folder / "model", family=family, vocab_size=vocab_size, seed=seed)
    say("  datasets ...")
    write_demo_dataset(folder / "data")


# ---- the command ------------------------------------------------------------------------------
class _Stopped(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, _frame) -> None:
    raise _Stopped(signum)


@contextlib.contextmanager
def _stop_signals() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP raise _Stopped (their defaults would end the process without its
    cleanup); one inherited as ignored (nohup) stays ignored."""
    saved = {s: signal.signal(s, _raise_stopped) for s in STOP_SIGNALS
             if signal.getsignal(s) not in (signal.SIG_IGN, None)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _io_errors() -> tuple[type[BaseException], ...]:
    try:  # safetensors reports a full disk as its own error, not an OSError
        from safetensors import SafetensorError
    except ImportError:
        return (OSError,)
    return (OSError, SafetensorError)


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    with _stop_signals():
        try:
            _make(Path(args.out), family=args.family, seed=args.seed)
        except KeyboardInterrupt as e:
            signum = getattr(e, "signum", signal.SIGINT)
            name = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
            print(f"interrupted{name}: nothing was written to {args.out!r}; run the same command again "
                  "to make the demo", file=sys.stderr)
            sys.exit(128 + signum)


def _make(out: Path, *, family: str, seed: int) -> None:
    try:
        paths = make_demo(out, family=family, seed=seed, say=lambda line: print(line, flush=True))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except _io_errors() as e:
        why = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        print(f"error: {_where(out)}: writing the demo failed ({why}); nothing was kept; free space "
              "or name a folder on another filesystem, and run it again", file=sys.stderr)
        sys.exit(2)
    model, docs = paths["model"], paths["docs"]
    sweep = ["trainlab", "train", "-m", "model=hf", _override("model.pretrained", model), "data=hf",
             _override("data.path", docs), _override("data.tokenizer", model), "precision=fp32,bf16",
             "parallel=ddp,fsdp", "cluster.num_workers=2", "train.max_steps=60", "train.export=hf",
             "sweep_name=hf_demo"]
    with _signals_held():  # made: a stop signal now must not say "nothing was written"
        print(f"model and tokenizer: {model}\ndocuments: {docs}\nchat: {paths['chat']}\n\n"
              f"next, a sweep on it:\n  {shlex.join(sweep)}", flush=True)


def _override(key: str, path: Path) -> str:
    """`key=path` as Hydra reads it (a path with a space, comma, bracket or quote in single quotes)."""
    value = str(path)
    if not re.fullmatch(r"[A-Za-z0-9_./~+-]+", value) or value.startswith(("-", "+", "~")):
        value = "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"
    return f"{key}={value}"


__all__ = ["check_out", "main", "make_demo"]
