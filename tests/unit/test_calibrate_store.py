"""`trainlab calibrate` reads a store: a mistyped store path is refused, never created there
(issue 28: reads)."""

from __future__ import annotations

import pytest

from trainlab.calibrate.command import main
from trainlab.tracking.store_check import check_store


@pytest.mark.parametrize("uri", ["sqlite:///{tmp}/mlflw.db", "file://{tmp}/mlrns"])
def test_a_store_that_is_read_must_exist(uri, tmp_path):
    """check_store is what every reading command (calibrate, compare) runs first."""
    uri = uri.format(tmp=tmp_path)
    with pytest.raises(ValueError, match="no MLflow store at.*pass --tracking-uri"):
        check_store(uri, field="--tracking-uri", elsewhere="pass --tracking-uri")
    assert list(tmp_path.iterdir()) == []


def test_a_mistyped_store_is_refused_and_not_created(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/typo/mlflow.db"
    with pytest.raises(SystemExit) as e:
        main(["--tracking-uri", uri, "-o", str(tmp_path / "calibration.json")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.count("\n") == 0 and err.startswith("error: "), err
    assert "--tracking-uri" in err and "no MLflow store at" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "calibrate made a store (or its folder) at a typo"


def test_a_sqlite_store_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    """sqlite opening a FIFO waits for a writer (calibrate hung in MLflow's retries)."""
    import os

    from trainlab.tracking.store_check import check_tracking_uri

    fifo = tmp_path / "mlflow.db"
    os.mkfifo(fifo)
    for check in (lambda u: check_store(u, field="--tracking-uri", elsewhere="pass --tracking-uri"),
                  lambda u: check_tracking_uri(u)):
        with pytest.raises(ValueError, match=f"{fifo} is a FIFO"):
            check(f"sqlite:///{fifo}")
