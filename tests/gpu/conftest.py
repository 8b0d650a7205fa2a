"""Each failure's reason printed under its test's name as it happens (not only in pytest's
summary at the end): a GPU lease's command cut at its deadline keeps both in its output.

Test modules everywhere import helpers with `from conftest import ...`, meaning tests/conftest.py;
once this file is loaded, `conftest` names this module (pytest's rootdir-less conftests share
one module name), so every other name is looked up in tests/conftest.py (`__getattr__`)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REASON_CHARS = 600
"""Of a failure's message, what is printed (the whole traceback stays in the summary and XML)."""
ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
_CONFIG: dict = {}


def short_reason(report) -> str:
    """Where and why a report failed, on one line: the crash's file:line and message, else the
    last line of its long representation."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        path = os.path.relpath(crash.path) if os.path.isabs(crash.path) else crash.path
        text = f"{path}:{crash.lineno}: {crash.message}"
    else:  # a plain string or tuple from a plugin
        lines = [line for line in str(report.longrepr).splitlines() if line.strip()]
        text = lines[-1] if lines else "no reason given"
    text = " | ".join(line.strip() for line in text.splitlines() if line.strip())
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS] + " ..."


def pytest_configure(config) -> None:
    _CONFIG["config"] = config


@pytest.hookimpl(trylast=True)  # after the terminal reporter's own FAILED / ERROR
def pytest_runtest_logreport(report) -> None:
    if not report.failed:
        return
    word = "FAILED" if report.when == "call" else f"ERROR at {report.when}"
    line = f"  -> {word} {report.nodeid}: {short_reason(report)}"
    config = _CONFIG.get("config")
    writer = config.pluginmanager.get_plugin("terminalreporter") if config is not None else None
    if writer is None:
        print(line, flush=True)
        return
    writer.ensure_newline()
    writer.write_line(line)
    writer.flush()


def _root():
    """tests/conftest.py as pytest loaded it (fixtures and helpers share its classes); in a
    process pytest did not start (a spawned rank importing a test module), loaded from its file."""
    config = _CONFIG.get("config")
    if config is not None:
        for plugin in config.pluginmanager.get_plugins():
            if Path(getattr(plugin, "__file__", None) or "-").resolve() == ROOT_CONFTEST:
                return plugin
    module = sys.modules.get("_tests_root_conftest")
    if module is None:
        spec = importlib.util.spec_from_file_location("_tests_root_conftest", ROOT_CONFTEST)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def __getattr__(name: str):
    # never pytest's own conftest names (pytest_plugins, collect_ignore, ...): those are per file
    if name.startswith(("_", "pytest")) or name.startswith("collect_ignore"):
        raise AttributeError(name)
    return getattr(_root(), name)
