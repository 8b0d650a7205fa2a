"""The architecture page lists every module of trainlab, layer by layer, as docs/files.py makes it."""

from __future__ import annotations

import importlib.util

from conftest import REPO


def load_generator():
    spec = importlib.util.spec_from_file_location("docs_files", REPO / "docs" / "files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_page_lists_every_module_as_generated():
    files = load_generator()
    page = files.PAGE.read_text()
    assert files.page_with(page, files.file_list()) == page, (
        "docs/pages/architecture.md's file list is stale: run `python docs/files.py --write`")


def test_every_module_of_the_package_is_on_the_page_once():
    files = load_generator()
    listed = [line.split("`")[1] for line in files.file_list().splitlines() if line.startswith("| `")]
    on_disk = sorted(p.relative_to(files.PACKAGE).as_posix() for p in files.PACKAGE.rglob("*.py")
                     if p != files.PACKAGE / "__init__.py")
    assert sorted(listed) == on_disk
