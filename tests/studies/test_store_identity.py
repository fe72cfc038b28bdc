"""A store's identity covers every input that defines a result, and an upgrade of the
code resumes only when the user accepts it (recorded in the store).

Each test here once failed against the code before it: a changed ``[metrics]``
expression or a changed ``ph:`` file resumed a half-done store silently, a ``ph:``
file was found relative to the working directory while ``arrivals`` were found
relative to the spec, and a docstring edit made every half-done store unresumable.
"""

import json
import os

import pytest

from jaxqueue.core import versions as versions_module
from jaxqueue.core.versions import code_text
from jaxqueue.studies.grids import grid
from jaxqueue.studies.grids.grid import run_grid
from jaxqueue.studies.grids.spec import load_spec, parse_spec
from jaxqueue.studies.grids.store import Store, StoreMismatchError

SPEC = """
name = "ident"
[grid]
policy = ["random"]
n_servers = [3]
n_dispatchers = [1]
load = [0.3, 0.6]
{service}
[run]
replicas = 2
steps = 512
warmup = 256
seed = 1
theory = "none"
{metrics}
"""


def _spec(metrics='[metrics]\nbusy = "s[1]"', service=""):
    return SPEC.format(metrics=metrics, service=service)


def test_code_text_ignores_docstrings_comments_and_layout_but_not_code():
    base = 'def f(x):\n    """Doc."""\n    return x + 1\n'
    assert code_text(base) == code_text(
        'def f(x):  # note\n    """Other."""\n\n    return (x + 1)\n'
    )
    assert code_text(base) == code_text("def f(x):\n    return x + 1\n")
    assert code_text(base) != code_text('def f(x):\n    """Doc."""\n    return x + 2\n')
    # a string that is not a docstring is code
    assert code_text('x = 1\n"a"\n') != code_text('x = 1\n"b"\n')


def test_the_package_digest_is_remembered_and_recomputed_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXQUEUE_CACHE_DIR", str(tmp_path))
    versions_module.source_digest.cache_clear()
    try:
        first = versions_module.source_digest()
        cached = json.loads((tmp_path / "code-digests.json").read_text())
        assert list(cached.values()) == [first]
        versions_module.source_digest.cache_clear()
        (tmp_path / "code-digests.json").write_text("not json")  # a damaged cache: recomputed
        assert versions_module.source_digest() == first
    finally:
        versions_module.source_digest.cache_clear()


def test_the_metrics_table_is_part_of_the_spec_hash():
    a = parse_spec(_spec())
    assert a.spec_hash() == parse_spec(_spec('[metrics]\nbusy  =  "s[1]"')).spec_hash()
    assert a.spec_hash() != parse_spec(_spec('[metrics]\nbusy = "s[2]"')).spec_hash()
    assert a.spec_hash() != parse_spec(_spec('[metrics]\nbusy = "s[1]"\nx = "N"')).spec_hash()
    # ids of points do not depend on the metrics: only the store's identity does
    assert [p.point_id() for p in a.points] == [p.point_id() for p in parse_spec(_spec("")).points]


def _ph(path, rate):
    path.write_text(json.dumps({"alpha": [1.0], "S": [[-rate]], "mean": None}))


def test_a_ph_file_is_found_beside_the_spec_and_its_bytes_are_in_the_hash(tmp_path, monkeypatch):
    folder = tmp_path / "specs"
    folder.mkdir()
    _ph(folder / "law.json", 2.0)
    spec_file = folder / "s.toml"
    spec_file.write_text(_spec(service='service = ["ph:law.json"]'))
    monkeypatch.chdir(tmp_path)  # not the spec's folder: the file is still found
    spec = load_spec(spec_file)
    point = spec.points[0]
    assert point.service == f"ph:{folder / 'law.json'}"
    assert point.params()["service"] == "ph:law.json"  # the id keeps the spelling
    assert point.rate() == pytest.approx(2.0)
    before = spec.spec_hash()
    _ph(folder / "law.json", 3.0)
    after = load_spec(spec_file)
    assert after.spec_hash() != before
    assert [p.point_id() for p in after.points] == [p.point_id() for p in spec.points]
    # a file that is not regular is refused, naming it
    (folder / "dir.json").mkdir()
    spec_file.write_text(_spec(service='service = ["ph:dir.json"]'))
    with pytest.raises(ValueError, match=r"dir\.json' is not a regular file"):
        load_spec(spec_file)


def _interrupted(spec, path, monkeypatch):
    """Run ``spec`` into ``path`` and stop it after its first committed batch."""
    real = Store.commit_batch

    def commit_then_stop(self, *args, **kwargs):
        real(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Store, "commit_batch", commit_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run_grid(spec, path, batch_points=1)
    monkeypatch.setattr(Store, "commit_batch", real)


def test_a_killed_sweep_does_not_resume_with_another_metric_definition(tmp_path, monkeypatch):
    path = tmp_path / "s.sqlite"
    _interrupted(parse_spec(_spec()), path, monkeypatch)
    with Store.open_existing(path) as store:
        assert len(store.done()) == 1
    with pytest.raises(StoreMismatchError, match="another spec"):
        run_grid(parse_spec(_spec('[metrics]\nbusy = "s[2]"')), path, batch_points=1)
    assert run_grid(parse_spec(_spec()), path, batch_points=1) == 1  # the same one resumes
    rows = [r for r in Store.open_existing(path).rows() if r["metric"] == "busy"]
    assert len(rows) == 2


def test_other_code_resumes_only_when_accepted_and_the_store_says_which_batches(
    tmp_path, monkeypatch
):
    path = tmp_path / "s.sqlite"
    spec = parse_spec(_spec())
    _interrupted(spec, path, monkeypatch)
    ours = versions_module.versions()
    new = {**ours, "source": "0123456789abcdef"}
    monkeypatch.setattr(grid, "versions", lambda: new)
    with pytest.raises(
        StoreMismatchError,
        match=rf"source: {ours['source']} there, 0123456789abcdef here.*--accept-code-change",
    ):
        run_grid(spec, path, batch_points=1)
    assert run_grid(spec, path, batch_points=1, accept_code_change=True) == 1
    with Store.open_existing(path) as store:
        meta = store.meta()
    assert meta["versions"] == ours
    assert meta["versions_accepted"] == [{"versions": new, "from_batch": 1}]
    # accepted once: the same code resumes without the flag; yet other code does not
    Store(path, spec.spec_hash(), spec.name, new).close()
    with pytest.raises(StoreMismatchError, match="other versions"):
        Store(path, spec.spec_hash(), spec.name, {**ours, "source": "fedcba9876543210"})


def test_the_cli_takes_accept_code_change(tmp_path, monkeypatch, capsys):
    from jaxqueue.cli import main as cli_main

    spec_file = tmp_path / "s.toml"
    spec_file.write_text(_spec())
    store = tmp_path / "s.sqlite"
    _interrupted(load_spec(spec_file), store, monkeypatch)
    new = {**versions_module.versions(), "source": "0123456789abcdef"}
    monkeypatch.setattr(grid, "versions", lambda: new)
    args = ["sweep", str(spec_file), "--store", str(store)]
    assert cli_main(args) == 3  # a store that cannot be resumed
    assert "--accept-code-change" in capsys.readouterr().err
    assert cli_main([*args, "--accept-code-change"]) == 0
    assert os.path.exists(store)
