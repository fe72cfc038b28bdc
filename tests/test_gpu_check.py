"""benchmarks/gpu_check.py --paper --quick: the CPU dry run of the command that runs the
paper-scale sweeps on a GPU. Each spec's [quick] mode at its smallest N is swept into
the output folder and its figures are drawn; the record says so; a second call finds
the stores complete and runs nothing again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (about 50 s on 2 busy cores: the dry run twice)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SPECS = {"mukherjee_hw": {"idle.png", "two.png"}, "liu_ying_fig2": {"fig2_s2.png", "waiting.png"}}


def _dry_run(out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--paper", "--quick", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_paper_dry_run_writes_stores_figures_and_its_record(tmp_path):
    record = _dry_run(tmp_path)
    assert record["paper_only"] is True and record["exactness"] == [] and record["rows"] == []
    rows = {r["spec"]: r for r in record["paper"]}
    assert list(rows) == list(SPECS)  # the cheaper spec first
    for name, figures in SPECS.items():
        row = rows[name]
        assert row["status"] == "ok" and row["figure_status"] == "ok", row
        assert row["stored_before"] == 0 and row["done"] == row["plan"]["points"] > 0
        assert (tmp_path / f"{name}.dry.sqlite").is_file()
        assert (tmp_path / f"{name}.dry.log").is_file()
        drawn = {Path(f).name for f in row["figures"]}
        assert figures <= drawn, drawn
        assert all((tmp_path / f).is_file() for f in row["figures"])
    assert json.loads((tmp_path / "gpu_check.json").read_text())["paper"] == record["paper"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| mukherjee_hw | quick (smallest N) |" in md and "liu_ying_fig2" in md
    # the same command again: the stores are complete, nothing runs, the figures are redrawn
    again = {r["spec"]: r for r in _dry_run(tmp_path)["paper"]}
    for name in SPECS:
        assert again[name]["status"] == "finished before", again[name]
        assert again[name]["stored_before"] == again[name]["done"] == rows[name]["done"]
        assert again[name]["figure_status"] == "ok"
