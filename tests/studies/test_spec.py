"""Grid specs of ``jaxqueue sweep SPEC.toml``: expansion, stable ids and hashes, every error.

Fast: nothing here compiles or simulates.
"""

import ast
import itertools
import math
import random
import re
from pathlib import Path

import pytest

from jaxqueue.core.system import MAX_STEPS
from jaxqueue.studies.grids import spec as spec_module
from jaxqueue.studies.grids.spec import (
    GridSpec,
    Point,
    RunSettings,
    SpecError,
    load_spec,
    parse_spec,
)

EXAMPLE = """\
# Wang et al. Fig. 4
name = "wang-fig4"            # optional; default: the file stem
[grid]
policy = ["jiq", { name = "jiq-pod", d = [2, 3] }, "pod"]   # strings or inline tables
n_servers = [1000]
ratio = [10]                  # or n_dispatchers = [100]
load = [0.5, 0.7, 0.9]
buffer = [0]                  # 0 or "inf" means infinite
[run]
replicas = 16
time = 300
warmup_time = 50
seed = 0
init = "mean-field"
theory = "mean-field"
[quick]
n_servers = [100]
time = 50
"""

BASE = """\
# test spec
[grid]
policy = ["jiq", "pod"]
n_servers = [100]
load = [0.5, 0.9]
[run]
replicas = 4
time = 50
"""


def edit(text, old, new):
    assert text.count(old) == 1, old
    return text.replace(old, new)


def ids(spec):
    return {(p.point_id(), p.seed_word(spec.run.seed)) for p in spec.points}


# ---- expansion -----------------------------------------------------------------------


def test_example_expands_in_order():
    spec = parse_spec(EXAMPLE)
    assert spec.name == "wang-fig4" and spec.source_text == EXAMPLE
    policies = [
        ("jiq", ()),
        ("jiq-pod", (("d", 2),)),
        ("jiq-pod", (("d", 3),)),
        ("pod", (("d", 2),)),
    ]
    expected = [
        Point(name, opts, 1000, 100, None, load)
        for (name, opts), load in itertools.product(policies, (0.5, 0.7, 0.9))
    ]
    assert list(spec.points) == expected
    assert spec.run == RunSettings(
        replicas=16,
        time=300.0,
        steps=None,
        warmup_time=50.0,
        warmup=None,
        seed=0,
        init="mean-field",
        theory="mean-field",
    )
    p = spec.points[0]
    assert p.params() == {
        "policy": "jiq",
        "options": {},
        "servers": 1000,
        "dispatchers": 100,
        "ratio": 10.0,
        "buffer": None,
        "load": 0.5,
        "alpha": None,
        "beta": None,
        "d": None,
        "z": None,
    }
    assert spec.points[3].params()["d"] == 2
    assert spec.run.steps_for(p) == 300 * 1000 * 1.5 and spec.run.warmup_for(p) == 50 * 1500


def test_axis_order_policy_servers_ratio_buffer_options_load():
    text = """\
[grid]
policy = ["jiq", { name = "pod", d = [3, 2] }]
n_servers = [20, 40]
ratio = [2, 4]
buffer = [5, "inf"]
load = [0.9, 0.5]
[run]
replicas = 2
steps = 10000
warmup = 100
"""
    got = [
        (p.policy, p.options, p.servers, p.dispatchers, p.buffer, p.load)
        for p in parse_spec(text).points
    ]
    want = []
    for (name, ds), n, r, b in itertools.product(
        [("jiq", [None]), ("pod", [3, 2])], [20, 40], [2, 4], [5, None]
    ):
        for d, load in itertools.product(ds, [0.9, 0.5]):
            want.append((name, () if d is None else (("d", d),), n, n // r, b, load))
    assert got == want


def test_defaults_scalars_and_dispatchers():
    spec = parse_spec(
        BASE.replace("[100]", "100").replace('["jiq", "pod"]', '"jsq"') + "\n", name="stem"
    )
    assert spec.name == "stem" and [p.load for p in spec.points] == [0.5, 0.9]
    assert {(p.dispatchers, p.buffer) for p in spec.points} == {(1, None)}
    assert spec.run == RunSettings(replicas=4, time=50.0, warmup_time=100.0)
    assert spec.run.seed == 0 and spec.run.init == "empty" and spec.run.theory == "none"
    spec = parse_spec(edit(BASE, "n_servers = [100]", "n_servers = [100]\nn_dispatchers = [1, 4]"))
    assert sorted({p.dispatchers for p in spec.points}) == [1, 4]
    assert parse_spec(BASE).name == "spec"


def test_finite_buffer_allows_overload_and_grid_options():
    text = edit(BASE, "load = [0.5, 0.9]", "load = [1.5]\nbuffer = 3\nd = [2, 4]")
    spec = parse_spec(edit(text, '["jiq", "pod"]', '["pod", "jiq-pod"]'))
    assert [(p.policy, p.params()["d"], p.buffer, p.load) for p in spec.points] == [
        ("pod", 2, 3, 1.5),
        ("pod", 4, 3, 1.5),
        ("jiq-pod", 2, 3, 1.5),
        ("jiq-pod", 4, 3, 1.5),
    ]
    spec = parse_spec(edit(BASE, '["jiq", "pod"]', '[{ name = "jiq-threshold", z = [0, 2] }]'))
    assert [p.params()["z"] for p in spec.points] == [0, 0, 2, 2]


@pytest.mark.parametrize(
    "key, form", [("alpha", lambda n, a: 1 - n**-a), ("beta", lambda n, b: 1 - b / math.sqrt(n))]
)
def test_heavy_traffic_loads(key, form):
    text = edit(edit(BASE, "load = [0.5, 0.9]", f"{key} = [0.5, 0.75]"), "[100]", "[100, 400]")
    spec = parse_spec(text)
    assert len(spec.points) == 8
    for p in spec.points:
        value = getattr(p, key)
        assert value in (0.5, 0.75) and p.load == pytest.approx(form(p.servers, value), rel=1e-15)
        assert getattr(p, "beta" if key == "alpha" else "alpha") is None
    assert {p.load for p in spec.points if p.servers == 100} == {form(100, 0.5), form(100, 0.75)}


def test_quick_overrides():
    full, quick = parse_spec(EXAMPLE), parse_spec(EXAMPLE, quick=True)
    assert {(p.servers, p.dispatchers) for p in quick.points} == {(100, 10)}
    assert quick.run.time == 50.0 and full.run.time == 300.0 and len(quick.points) == 12
    assert quick.spec_hash() != full.spec_hash()
    # a quick key replaces its whole group of alternatives
    text = edit(
        EXAMPLE, "n_servers = [100]\ntime = 50\n", "steps = 20000\nalpha = 0.5\nn_dispatchers = 5\n"
    )
    spec = parse_spec(text, quick=True)
    assert spec.run.steps == 20000 and spec.run.time is None
    got = {(p.servers, p.dispatchers, p.alpha, p.load) for p in spec.points}
    assert got == {(1000, 5, 0.5, 1 - 1000**-0.5)}


@pytest.mark.parametrize(
    "old, new, named",
    [
        (
            "load = [0.5, 0.9]",
            "load = [0.5, 0.50000000000001]  # <-",
            "load=0.5 and load=0.50000000000001",
        ),
        (
            "load = [0.5, 0.9]",
            "alpha = [0.5, 0.5000000000000004]  # <-",
            "alpha=0.5 and alpha=0.5000000000000004",
        ),
    ],
)
def test_values_one_id_apart_are_refused_with_both_named(old, new, named):
    """Values that agree to 12 significant digits would share one point id
    (the store's key): refused up front, as a duplicate is, both named."""
    text = edit(BASE, old, new)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "# <-" in row)
    with pytest.raises(
        SpecError,
        match=rf"^line {line}: {re.escape(named)}.* agree to 12 "
        "significant digits, so they would be one point",
    ):
        parse_spec(text)
    with pytest.raises(SpecError, match="load lists 0.5 twice"):  # equal values: the axis says so
        parse_spec(edit(BASE, old, "load = [0.5, 0.5]"))


def test_a_run_length_expression_that_fails_at_a_point_names_it():
    text = edit(BASE, "time = 50", 'time = "10 / (load - 0.5)"')
    with pytest.raises(
        SpecError,
        match=r"time at jiq N=100 M=1 buffer=inf load=0\.5: "
        r"'10 / \(load - 0\.5\)' cannot be evaluated",
    ):
        parse_spec(text)


def test_a_name_with_control_characters_is_refused():
    with pytest.raises(SpecError, match=r"without '/' or control characters, got 'a\\nb'"):
        parse_spec('name = "a\\nb"\n' + BASE)


def test_gpu_mode_is_a_spec_of_its_own():
    text = EXAMPLE + '[gpu]\nreplicas = 64\ntime = 20\ninit = "mean-field"\n'
    full, quick, gpu = (parse_spec(text, mode=m) for m in (None, "quick", "gpu"))
    assert (gpu.run.replicas, gpu.run.time, gpu.run.init) == (64, 20.0, "mean-field")
    assert full.run.replicas == quick.run.replicas != 64 and full.points == gpu.points
    assert len({full.spec_hash(), quick.spec_hash(), gpu.spec_hash()}) == 3
    assert parse_spec(text, quick=True).spec_hash() == quick.spec_hash()
    with pytest.raises(SpecError, match=r"^line 1: --gpu needs a \[gpu\] table"):
        parse_spec(EXAMPLE, mode="gpu")
    with pytest.raises(SpecError, match=r"line \d+: unknown key 'name' in \[gpu\]"):
        parse_spec(EXAMPLE + "[gpu]\nname = 'g'\n")
    with pytest.raises(ValueError, match="mode='slow' is not valid: use one of quick, gpu"):
        parse_spec(text, mode="slow")
    with pytest.raises(ValueError, match="quick=True and mode='gpu': give one mode"):
        parse_spec(text, quick=True, mode="gpu")


def test_load_spec_reads_name_from_stem(tmp_path):
    path = tmp_path / "fig5.toml"
    path.write_text(BASE)
    assert load_spec(path).name == "fig5" and load_spec(str(path)).source_text == BASE
    path.write_text(edit(BASE, "n_servers = [100]", "n_servers = []"))
    with pytest.raises(SpecError, match=r"fig5\.toml: line 4: servers is empty") as info:
        load_spec(path)
    assert info.value.line == 4


def test_spec_imports_nothing_from_sim_or_theory():
    tree = ast.parse(Path(spec_module.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.startswith(("jaxqueue.sim", "jaxqueue.theory"))]


# ---- ids, seeds, hashes -----------------------------------------------------------------


def test_point_id_is_a_fixed_function_of_the_point():
    p = Point("pod", (("d", 2),), 100, 10, None, 0.9)
    assert p.point_id() == "d2b72ae1ca728f04"
    assert p.seed_word(0) == 1091896035
    assert p == Point("pod", (("d", 2),), 100, 10, None, 0.9) and len({p, p}) == 1
    assert len(p.point_id()) == 16 and int(p.point_id(), 16) >= 0
    words = {p.seed_word(s) for s in range(100)}
    assert len(words) == 100 and all(0 <= w < 2**31 for w in words)
    d2 = (("d", 2),)
    others = [
        Point("pod", (("d", 3),), 100, 10, None, 0.9),
        Point("jiq-pod", d2, 100, 10, None, 0.9),
        Point("pod", d2, 100, 10, 5, 0.9),
        Point("pod", d2, 100, 10, None, 0.8),
        Point("pod", d2, 100, 20, None, 0.9),
        Point("pod", d2, 200, 10, None, 0.9),
        Point("pod", d2, 100, 10, None, 0.9, alpha=0.5),
    ]
    assert len({q.point_id() for q in others} | {p.point_id()}) == len(others) + 1


def test_ids_do_not_depend_on_grid_order():
    text = """\
[grid]
policy = ["jiq", { name = "jiq-pod", d = [2, 3] }, "pod", "jsq"]
n_servers = [50, 100, 200]
ratio = [1, 5, 10]
buffer = [0, 4]
load = [0.3, 0.5, 0.7, 0.9]
[run]
replicas = 4
time = 20
seed = 7
"""
    spec = parse_spec(text)
    reference = ids(spec)
    assert len(reference) == len(spec.points) == 5 * 3 * 3 * 2 * 4
    rng = random.Random(0)
    for _ in range(5):
        lines = text.splitlines()
        policies = ['"jiq"', '{ name = "jiq-pod", d = [3, 2] }', '"pod"', '"jsq"']
        rng.shuffle(policies)
        lines[1] = f"policy = [{', '.join(policies)}]"
        for i, key in ((2, "n_servers"), (3, "ratio"), (4, "buffer"), (5, "load")):
            values = lines[i].split("=")[1].strip(" []").split(", ")
            rng.shuffle(values)
            lines[i] = f"{key} = [{', '.join(values)}]"
        shuffled = parse_spec("\n".join(lines))
        assert [p.point_id() for p in shuffled.points] != [p.point_id() for p in spec.points]
        assert ids(shuffled) == reference
    # a point of a smaller grid is the same point
    one = BASE.replace('["jiq", "pod"]', '"jsq"').replace("[100]", "[50]\nn_dispatchers = 50")
    one = parse_spec(one.replace("[0.5, 0.9]", "[0.7]").replace("time = 50", "time = 20\nseed = 7"))
    assert ids(one) <= reference


def test_spec_hash_ignores_comments_layout_and_order():
    spec = parse_spec(EXAMPLE)
    h = spec.spec_hash()
    assert len(h) == 64
    same = [
        EXAMPLE.replace("# Wang et al. Fig. 4", "# another comment\n\n"),
        EXAMPLE.replace("load = [0.5, 0.7, 0.9]", "load = [\n  0.5,\n  0.7,   # middle\n  0.9,\n]"),
        EXAMPLE.replace("time = 300", "time = 300.0").replace("buffer = [0]", 'buffer = "inf"'),
        EXAMPLE.replace('"jiq", {', '"jiq",{').replace("replicas = 16", "replicas=16  # r"),
        EXAMPLE.replace('"pod"]', '{ name = "pod", d = 2 }]'),  # the default written out
        EXAMPLE.replace("ratio = [10]", "n_dispatchers = [100]"),
        EXAMPLE.replace("n_servers = [100]\ntime = 50", "n_servers = [10]"),  # [quick] is not used
        EXAMPLE.replace('name = "wang-fig4"', 'name = "other"'),
        EXAMPLE.replace("[0.5, 0.7, 0.9]", "[0.9, 0.5, 0.7]").replace(  # the order of the grid
            '"jiq", { name = "jiq-pod", d = [2, 3] }, "pod"',
            '"pod", { name = "jiq-pod", d = [3, 2] }, "jiq"',
        ),
    ]
    for text in same:
        assert parse_spec(text).spec_hash() == h, text


@pytest.mark.parametrize(
    "old, new",
    [
        ("load = [0.5, 0.7, 0.9]", "load = [0.5, 0.7, 0.8]"),
        ("n_servers = [1000]", "n_servers = [2000]"),
        ("ratio = [10]", "ratio = [20]"),
        ("buffer = [0]", "buffer = [0, 8]"),
        ("d = [2, 3]", "d = [2, 4]"),
        ('"pod"]', '{ name = "pod", d = 3 }]'),
        ("replicas = 16", "replicas = 32"),
        ("time = 300", "time = 301"),
        ("time = 300", "steps = 300000"),
        ("warmup_time = 50", "warmup_time = 51"),
        ("seed = 0", "seed = 1"),
        ('init = "mean-field"', 'init = "empty"'),
        ('theory = "mean-field"', 'theory = "none"'),
    ],
)
def test_spec_hash_changes_with_any_value(old, new):
    assert parse_spec(edit(EXAMPLE, old, new)).spec_hash() != parse_spec(EXAMPLE).spec_hash()


def test_steps_round_up_and_are_bounded():
    run = RunSettings(replicas=2, time=0.01, warmup_time=None, warmup=3)
    p = Point("jsq", (), 100, 1, None, 0.5)
    assert run.steps_for(p) == 2 and run.warmup_for(p) == 3  # ceil(0.01 * 150) = 2
    assert RunSettings(replicas=2, steps=7).steps_for(p) == 7
    with pytest.raises(SpecError, match=f"need at most {MAX_STEPS}"):
        RunSettings(replicas=2, time=1e17).steps_for(p)
    assert RunSettings(replicas=2, time=1e8).steps_for(p) == 15_000_000_000  # no 32-bit ceiling
    with pytest.raises(SpecError, match="needs one of time / steps"):
        RunSettings(replicas=2, time=1.0, steps=10)
    with pytest.raises(SpecError, match="one of warmup_time / warmup"):
        RunSettings(replicas=2, time=1.0, warmup=10)


def test_run_lengths_as_expressions_of_the_point():
    text = edit(
        edit(
            BASE,
            "time = 50",
            'time = "20 + servers ** (2 * alpha - 1)"\n'
            'warmup_time = "5 * servers ** (2 * alpha - 1)"',
        ),
        "load = [0.5, 0.9]",
        "alpha = [0.5, 0.75]",
    )
    spec = parse_spec(text)
    for p in spec.points:
        grow = p.servers ** (2 * p.alpha - 1)
        assert spec.run.time_units("time", p) == pytest.approx(20 + grow, rel=1e-15)
        per = p.servers * (1 + p.load)
        assert spec.run.steps_for(p) == math.ceil((20 + grow) * per)
        assert spec.run.warmup_for(p) == math.ceil(5 * grow * per)
    # the expression is part of the hash; its spelling as a number is not
    assert spec.spec_hash() != parse_spec(text.replace("20 +", "21 +")).spec_hash()


# ---- errors --------------------------------------------------------------------------

# id, edit of BASE (old -> new; "# <-" marks the line the error must name), message pattern,
# further edits
# fmt: off
ERRORS = [
    ("toml", "n_servers = [100]", "servers == [100]  # <-", "not valid TOML"),
    ("unknown table", "[run]", "[gird]  # <-\nx = 1\n[run]",
     "unknown key or table 'gird'; valid: name, grid, run, quick"),
    ("unknown top key", "# test spec", 'nmae = "x"  # <-', "unknown key or table 'nmae'"),
    ("unknown grid key", "n_servers = [100]", "n_servers = [100]\nservrs = [1]  # <-",
     r"unknown key 'servrs' in \[grid\]; valid: policy, n_servers, n_dispatchers, ratio"),
    ("unknown run key", "time = 50", "time = 50\nsteeps = 3  # <-",
     r"unknown key 'steeps' in \[run\]; valid: replicas, time, steps"),
    ("unknown quick key", "time = 50", "time = 50\n[quick]\nname = 'q'  # <-",
     r"unknown key 'name' in \[quick\]"),
    ("unknown policy", '["jiq", "pod"]', '["jiq", "podd"]  # <-',
     "unknown policy 'podd'; valid names: .*jiq-pod.*random"),
    ("unknown policy, multi-line", '["jiq", "pod"]', '[\n  "jiq",\n  "podd",  # <-\n]',
     "unknown policy 'podd'"),
    ("policy not a name", '["jiq", "pod"]', "[1]  # <-", "a policy is a name or an inline table"),
    ("option not taken", '["jiq", "pod"]', '["pod", { name = "jiq", d = 2 }]  # <-',
     "policy 'jiq' takes no option d; its options: none"),
    ("grid option not taken", "n_servers = [100]", "n_servers = [100]\nd = [2]  # <-",
     "policy 'jiq' takes no option d; its options: none"),
    ("option twice", '["jiq", "pod"]', '[{ name = "pod", d = 3 }]\nd = 2  # <-',
     r"d is given both in \[grid\] and for policy 'pod'"),
    ("option out of range", '["jiq", "pod"]',
     '[\n"jiq",\n{ name = "pod", d = [2, 500] },  # <-\n]',
     "pod at servers=100, dispatchers=1: d=500 is out of range"),
    ("grid d, a policy without d", '["jiq", "pod"]', '["jiq", "pod"]\nd = 2.0  # <-',
     "policy 'jiq' takes no option d"),
    ("option wrong type", '["jiq", "pod"]', '["pod"]\nd = 2.5  # <-',
     "d must be an int, got 2.5"),
    ("single dispatcher", "n_servers = [100]", "n_servers = [100]\nratio = 10  # <-\n",
     "'idle-first' is a single-dispatcher scheme, need n_dispatchers = 1",
     ('["jiq", "pod"]', '["idle-first"]')),
    ("empty axis", "n_servers = [100]", "n_servers = []  # <-", "servers is empty: give at least one"),
    ("empty policy", 'policy = ["jiq", "pod"]', "policy = []  # <-", "policy is empty"),
    ("empty option", '["jiq", "pod"]', '[{ name = "pod", d = [] }]  # <-', "option d is empty"),
    ("servers type", "n_servers = [100]", 'n_servers = ["100"]  # <-',
     "servers must be an int, got '100'"),
    ("servers range", "n_servers = [100]", "n_servers = [0]  # <-",
     "servers=0 is out of range: need 1 <="),
    ("load type", "load = [0.5, 0.9]", 'load = "half"  # <-',
     "load must be a finite number, got 'half'"),
    ("load nan", "load = [0.5, 0.9]", "load = [nan]  # <-", "load must be a finite number"),
    ("replicas type", "replicas = 4", "replicas = 4.0  # <-", "replicas must be an int, got 4.0"),
    ("time type", "time = 50", 'time = [50]  # <-',
     "time must be a finite number or an expression string"),
    ("init type", "time = 50", "time = 50\ninit = 3  # <-", "init=3 is not valid"),
    ("grid not a table", "[grid]\n", "grid = 3  # <-\n[grd]\n", "grid must be a table"),
    ("load >= 1", "load = [0.5, 0.9]", "load = [0.5, 1.0]  # <-",
     "load=1.0 is out of range: infinite buffers need 0 < load < 1"),
    ("load >= 1, one infinite buffer", "load = [0.5, 0.9]", "load = [1.2]  # <-\nbuffer = [2, 0]",
     "infinite buffers need 0 < load < 1"),
    ("beta gives load 1", "load = [0.5, 0.9]", "beta = [1.0, 0.0]  # <-",
     r"beta=0.0 at servers=100: beta=0.0 is out of range: need 0 < beta < sqrt\(N\) = 10"),
    ("beta gives load > 1", "load = [0.5, 0.9]", "beta = -1  # <-", "need 0 < beta < sqrt"),
    ("alpha out of range", "load = [0.5, 0.9]", "alpha = [0.5, 0]  # <-",
     "alpha=0 at servers=100: alpha=0 is out of range: need 0 < alpha <= 1"),
    ("alpha, one server", "n_servers = [100]", "n_servers = 1\nalpha = [0.5]  # <-",
     "need 2 <= n_servers", ("load = [0.5, 0.9]\n", "")),
    ("load 0", "load = [0.5, 0.9]", "load = [0.5, 0]  # <-",
     "load=0 is out of range: need load > 0"),
    ("load negative", "load = [0.5, 0.9]", "load = -0.5  # <-", "need load > 0"),
    ("ratio and dispatchers", "n_servers = [100]",
     "n_servers = [100]\nratio = 10\nn_dispatchers = 10  # <-",
     r"\[grid\] gives ratio and dispatchers: give only one of ratio / dispatchers"),
    ("no load", "[grid]", "[grid]  # <-", r"\[grid\] needs one of load / alpha / beta",
     ("load = [0.5, 0.9]\n", "")),
    ("load and beta", "load = [0.5, 0.9]", "load = [0.5, 0.9]\nbeta = [1]  # <-",
     r"\[grid\] gives load and beta: give only one of load / alpha / beta"),
    ("ratio does not divide", "n_servers = [100]", "n_servers = [100, 30]\nratio = [10, 3]  # <-",
     ("ratio=3 does not split servers=100 into a whole number of dispatchers: "
      "need servers / ratio = an integer from 1 to 100")),
    ("ratio below 1", "n_servers = [100]", "n_servers = [100]\nratio = 0.5  # <-",
     "ratio=0.5 does not split"),
    ("dispatchers range", "n_servers = [100]", "n_servers = [100]\nn_dispatchers = [200]  # <-",
     "dispatchers=200 is out of range: need 1 <= dispatchers <= 100"),
    ("buffer negative", "n_servers = [100]", "n_servers = [100]\nbuffer = [-1]  # <-",
     r'buffer=-1 is out of range: need 1 <= buffer <= 10\*\*6, or 0 or "inf"'),
    ("buffer text", "n_servers = [100]", "n_servers = [100]\nbuffer = ['infinite']  # <-",
     "buffer must be an int"),
    ("replicas < 2", "replicas = 4", "replicas = 1  # <-",
     "replicas=1 is out of range: need 2 <= replicas"),
    ("no replicas", "replicas = 4\n", "", r"\[run\] needs replicas", ("[run]", "[run]  # <-")),
    ("time and steps", "time = 50", "time = 50\nsteps = 1000  # <-",
     r"\[run\] gives time and steps: give only one of time / steps"),
    ("neither time nor steps", "[run]", "[run]  # <-", r"\[run\] needs one of time / steps",
     ("time = 50\n", "")),
    ("warmup and warmup_time", "time = 50", "time = 50\nwarmup = 10\nwarmup_time = 3  # <-",
     "gives warmup_time and warmup"),
    ("time 0", "time = 50", "time = 0  # <-", "time=0 is out of range: need time > 0"),
    ("steps too many", "time = 50", "steps = 5_000_000_000_000_000_000  # <-",
     "steps=5000000000000000000 is out of range: need 1 <= steps <= 4611686018427387904"),
    ("time too long", "time = 50", "time = 1e17  # <-",
     r"time=1e\+17 is \d+ steps per replica"),
    ("warm-up too long", "time = 50", "time = 1  # <-",
     (r"a run too short for its warm-up: the warm-up is 15000 steps \(100 time units\) "
      r"and the measured part 150 steps \(1 time units\)")),
    ("warm-up too long, steps", "time = 50", "steps = 100  # <-\nwarmup = 1001",
     "too short for its warm-up: the warm-up is 1001 steps"),
    ("negative warmup", "time = 50", "time = 50\nwarmup = -1  # <-", "warmup=-1 is out of range"),
    ("seed", "time = 50", "time = 50\nseed = -3  # <-", "seed=-3 is out of range"),
    ("unknown init", "time = 50", 'time = 50\ninit = "full"  # <-',
     "init='full' is not valid: use one of 'empty', 'mean-field'"),
    ("unknown theory", "time = 50", 'time = 50\ntheory = "exactly"  # <-',
     "theory='exactly' is not valid: use one of 'mean-field', 'refined', 'exact', 'erlang', "
     "'lu', 'none'"),
    ("exact is for small systems", "time = 50", 'time = 50\ntheory = "exact"  # <-',
     "theory='exact' is for small systems"),
    ("duplicate load", "load = [0.5, 0.9]", "load = [0.5, 0.9, 0.5]  # <-", "load lists 0.5 twice"),
    ("duplicate buffer", "n_servers = [100]", 'n_servers = [100]\nbuffer = [0, "inf"]  # <-',
     "buffer lists 'inf' twice"),
    ("duplicate policy", '["jiq", "pod"]',
     '[\n  "pod",\n  "jiq",\n  { name = "pod", d = 2 },  # <-\n]',
     r"duplicate point pod\(d=2\) N=100 M=1 buffer=inf load=0.5 \(also from line 4\)"),
    ("duplicate option", '["jiq", "pod"]', '[{ name = "pod", d = [2, 2] }]  # <-',
     "repeats a value"),
    ("quick value", "time = 50", "time = 50\n[quick]\nn_servers = []  # <-", "servers is empty"),
    ("quick group", "time = 50", "time = 50\n[quick]\nsteps = 10  # <-\nwarmup = 101",
     "too short for its warm-up: the warm-up is 101 steps"),
    ("time expression name", "time = 50", 'time = "50 * policy"  # <-',
     "time='50 \\* policy' names policy: valid names are n_servers"),
    ("time expression syntax", "time = 50", 'time = "50 *"  # <-', "is not an expression"),
    ("time expression unset", "time = 50", 'time = "50 * alpha"  # <-',
     "time='50 \\* alpha' is nan at jiq .* need a finite value > 0"),
    ("warmup expression negative", "time = 50", 'time = 50\nwarmup_time = "10 - load * 20"  # <-',
     "warmup_time='10 - load \\* 20' is -8 at .* need a finite value >= 0"),
]
# fmt: on


@pytest.mark.parametrize("case", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_their_line(case):
    _, old, new, pattern, *more = case
    text = edit(BASE, old, new)
    for old2, new2 in more:
        text = edit(text, old2, new2)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "# <-" in row)
    with pytest.raises(SpecError, match=rf"^line {line}: .*{pattern}") as info:
        parse_spec(text, quick="[quick]" in text)
    assert info.value.line == line and isinstance(info.value, ValueError)


def test_exact_theory_for_small_systems():
    text = edit(BASE, "n_servers = [100]", "n_servers = [4]\nn_dispatchers = [1, 2]")
    spec = parse_spec(edit(text, "time = 50", 'time = 50\ntheory = "exact"'))
    assert spec.run.theory == "exact" and len(spec.points) == 8


def test_quick_without_quick_table():
    with pytest.raises(SpecError, match=r"^line 1: --quick needs a \[quick\] table"):
        parse_spec(BASE, quick=True)
    parse_spec(BASE + "[quick]\nn_servers = []\n")  # quick values are checked with --quick only


def test_missing_tables():
    with pytest.raises(SpecError, match=r"the spec has no \[run\] table"):
        parse_spec(BASE.split("[run]")[0])
    with pytest.raises(SpecError, match=r"the spec has no \[grid\] table"):
        parse_spec("[run]\nreplicas = 2\ntime = 1\n")
    with pytest.raises(SpecError, match=r"^line 2: name must be a non-empty string"):
        parse_spec('# x\nname = ""\n' + BASE)


def test_spec_error_is_a_value_error_without_line():
    err = SpecError("x")
    assert isinstance(err, ValueError) and err.line is None and str(err) == "x"
    assert isinstance(parse_spec(BASE), GridSpec)


# ---- service laws and pools -------------------------------------------------------------


def test_service_and_pools_axes():
    plain = parse_spec(BASE)
    spec = parse_spec(
        edit(
            BASE,
            "load = [0.5, 0.9]",
            'load = [0.5, 0.9]\nservice = ["exp", "erlang:4"]\npools = ["0.2:2,0.8:1"]',
        )
    )
    assert len(spec.points) == 2 * len(plain.points)
    by = {(p.policy, p.load, p.service): p for p in spec.points}
    p = by["pod", 0.9, "erlang:4"]
    assert p.pools == "0.2:2,0.8:1" and p.params()["service"] == "erlang:4"
    assert [(q.count, q.speed) for q in p.pool_set()] == [(20, 2.0), (80, 1.0)]
    assert p.rate() == pytest.approx(8.0)  # speed 2 x the Erlang-4 phase rate 4
    # the time unit follows the uniformization rate: N * (load + gamma) steps
    assert spec.run.steps_for(p) == math.ceil(50 * 100 * (0.9 + 8.0))
    # "exp" is the default law: such points have the ids of a spec without the key
    exp_only = parse_spec(edit(BASE, "load = [0.5, 0.9]", 'load = [0.5, 0.9]\nservice = "exp"'))
    assert ids(exp_only) == ids(plain)
    # pools raise the capacity: load 1.1 is stable with 20% of the servers twice as fast
    fast = parse_spec(edit(BASE, "load = [0.5, 0.9]", 'load = [1.1]\npools = "0.2:2,0.8:1"'))
    assert {p.load for p in fast.points} == {1.1}


@pytest.mark.parametrize(
    "line, error",
    [
        ('service = ["weibull:2"]', "service"),
        ('pools = ["0.2:2"]', "sum to 1"),
        ('pools = ["0.5:2,0.5"]', "FRACTION:SPEED"),
    ],
)
def test_service_and_pools_errors(line, error):
    with pytest.raises(SpecError, match=error) as info:
        parse_spec(edit(BASE, "load = [0.5, 0.9]", "load = [0.5, 0.9]\n" + line))
    assert info.value.line == 6


def test_service_with_a_per_server_policy_is_an_error():
    text = edit(BASE, '["jiq", "pod"]', '["jiq-original"]')
    text = edit(text, "n_servers = [100]", 'n_servers = [100]\nratio = [10]\nservice = "erlang:2"')
    with pytest.raises(SpecError, match="exchangeable"):
        parse_spec(text)


def test_the_spec_shown_in_the_docs_is_valid(tmp_path):
    """docs/sweeps.md's example spec, every key at once, parses (its arrival
    file pointed at a real one) into points with a service law, pools and a
    rate profile."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "sweeps.md").read_text()
    block = text.split("## The spec", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    day = (root / "sweeps" / "data" / "daily_profile.csv").as_posix()
    assert '"data/day.csv"' in block
    spec = parse_spec(block.replace('"data/day.csv"', f'"{day}"'), base=tmp_path)
    assert spec.name == "wang_fig4"
    assert {p.policy for p in spec.points} == {"jiq", "jiq-pod", "pod"}
    assert {p.service for p in spec.points} == {None, "erlang:4"}  # "exp" is the default
    assert all(p.pools == "0.2:2,0.8:1" and p.arrivals for p in spec.points)
    quick = parse_spec(block.replace('"data/day.csv"', f'"{day}"'), base=tmp_path, quick=True)
    assert {p.servers for p in quick.points} == {500}
