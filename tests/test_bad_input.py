"""Bad input, property-tested: every bad value of a ``barter-mini`` argument or of a notebook
parameter is a one-line error, never a traceback, and is refused before any work starts.

On the command line (``barter_mini.cli.main`` in-process, stderr captured) a refusal is exit
status 2 with one error line: the package's ``error: ...`` alone, or argparse's usage and its
``barter-mini CMD: error: ...`` line last. No training, bench, overhead or book step may start:
the ``no_work`` fixture turns the first step of each into a :class:`WorkStarted` exception,
which fails the test as the traceback it would be. Nothing is left behind: the ``--out`` run
folder is not created, an export's or a bench's ``--out`` file not written.

Notebook parameters go through the functions the notebooks call with them (the profile
resolution, the method, variant, policy and multiplier checks): a bad value is one
:class:`~barter_mini.errors.BarterError` line, the failure papermill shows.
"""

import math
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from barter_mini.book.profiles import DATASET_NAMES, PROFILES, resolve_profile
from barter_mini.cli import main
from barter_mini.core.configs import MODEL_CONFIGS
from barter_mini.errors import BarterError
from barter_mini.training.methods import METHODS

#: few examples per property and no deadline: the whole file runs in well under a minute
PROPERTY = settings(max_examples=50, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: a train command that would be seconds of work were a bad value let through
TRAIN = ["train", "--dataset", "digits", "--recipe", "smoke", "--no-progress"]


class WorkStarted(Exception):
    """A bad value got past every check: the work it would spoil began."""


@pytest.fixture
def no_work(monkeypatch):
    """Stop training, the bench, the overhead timing and the book build at their first step."""
    import barter_mini.book.build as book_build
    import barter_mini.measure.bench as bench
    import barter_mini.measure.timing as timing
    import barter_mini.training.trainer as trainer

    def stop(what):
        def raise_started(*args, **kwargs):
            raise WorkStarted(f"{what} started")
        return raise_started

    build_training = trainer.build_training

    def build_then_stop(*args, **kwargs):
        build_training(*args, **kwargs)      # every check of the run, its data and its model
        raise WorkStarted("training started")

    monkeypatch.setattr(trainer, "build_training", build_then_stop)
    monkeypatch.setattr(bench, "build_training_step", stop("the bench"))
    monkeypatch.setattr(timing, "UnitStatistics", stop("the overhead timing"))
    monkeypatch.setattr(book_build, "stage_sources", stop("the book build"))


def run_cli(argv, capsys) -> tuple[int, str]:
    """``barter-mini ARGV`` in-process: its exit status and what it wrote to stderr."""
    capsys.readouterr()
    try:
        status = main([str(arg) for arg in argv])
    except SystemExit as exit_:          # argparse's refusal
        status = exit_.code
    return status, capsys.readouterr().err


def assert_refused(status, stderr: str) -> None:
    assert status == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr
    if not lines[0].startswith("usage:"):          # the package's own message: that line alone
        assert len(lines) == 1 and lines[0].startswith("error: "), stderr


# --------------------------------------------------------------------------- bad values

def numbers(values) -> st.SearchStrategy[str]:
    """Text of numbers: ``repr`` of floats and ``str`` of integers."""
    return values.map(lambda v: repr(v) if isinstance(v, float) else str(v))


#: not a number at all
#: ("--" is left out: argparse reads ``--flag=--`` as no value at all and keeps the default)
GARBAGE = st.one_of(st.sampled_from(["", "abc", "1,5", "0x10", "one", "1..2", " "]),
                    st.text(string.ascii_letters + "_-/ ", min_size=1, max_size=8))
NON_FINITE = st.sampled_from(["nan", "inf", "-inf", "NaN", "1e400", "-1e400"])
#: not an integer >= 1
NOT_POSITIVE_INTEGER = st.one_of(numbers(st.integers(max_value=0)), NON_FINITE, GARBAGE,
                                 numbers(st.floats(allow_nan=False, allow_infinity=False).filter(
                                     lambda x: not x.is_integer())), st.sampled_from(["2e3", "1.0", "3.5"]))
#: not a positive finite number
NOT_POSITIVE_NUMBER = st.one_of(numbers(st.floats(max_value=0.0)), numbers(st.integers(max_value=0)),
                                NON_FINITE, GARBAGE)
#: outside (0, 1], or inside it but too small to keep a head in each of cct-mini's layers
BAD_DENSITY = st.one_of(numbers(st.floats().filter(lambda x: not 0 < x <= 1)), NON_FINITE, GARBAGE,
                        numbers(st.floats(min_value=1e-300, max_value=0.05)))
BAD_SEED = st.one_of(numbers(st.integers(max_value=-1)), numbers(st.integers(min_value=2**32)),
                     numbers(st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer())),
                     NON_FINITE, GARBAGE)


def unknown(allowed) -> st.SearchStrategy[str]:
    """A name outside ``allowed``."""
    return st.text(string.ascii_letters + string.digits + "-_.:", max_size=12).filter(lambda s: s not in allowed)


def bad_list(item_strategy) -> st.SearchStrategy[str]:
    """A comma-separated list with at least one bad item, or with no item at all."""
    return st.one_of(st.sampled_from(["", ",", ",,", " , "]),
                     st.tuples(item_strategy, st.sampled_from(["", "0.3,", "0.5,0.7,"]))
                     .map(lambda pair: pair[1] + pair[0]))


#: classes that no digits run can train on: unparsable, out of 0..9, repeated or just one
BAD_CLASSES = st.one_of(st.sampled_from(["5-2", "x", ",", "1,1", "0-99", "-1", "0--3", "a-b", "3-3"]),
                        st.integers(min_value=10, max_value=10**6).map(lambda n: f"0,{n}"),
                        st.integers(min_value=0, max_value=9).map(str))


@pytest.fixture
def unusable_paths(tmp_path):
    """Folder paths that cannot be created: under a file, a file itself, on /proc or /sys."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    return st.one_of(st.just(afile), st.text(string.ascii_lowercase, min_size=1, max_size=6).flatmap(
        lambda name: st.sampled_from([afile / name, Path("/proc", name), Path("/sys", name), Path("/dev/null", name)])))


# --------------------------------------------------------------------------- train

TRAIN_NAMES = {"--method": set(METHODS), "--model": set(MODEL_CONFIGS), "--recipe": {"paper", "quick", "smoke"},
               "--dataset": set(DATASET_NAMES), "--start": {"even", "first", "last"},
               "--device": {"auto", "cpu", "cuda"}}

BAD_TRAIN_FLAG = st.one_of(
    st.tuples(st.sampled_from(["--epochs", "--batch-size", "--train-subset", "--delta-t", "--img-size",
                               "--checkpoint-every"]), NOT_POSITIVE_INTEGER),
    st.tuples(st.just("--img-size"), numbers(st.integers(min_value=513))),
    st.tuples(st.sampled_from(["--lr", "--transfer-multiplier", "--pflops"]), NOT_POSITIVE_NUMBER),
    st.tuples(st.just("--density"), BAD_DENSITY),
    st.tuples(st.just("--seed"), BAD_SEED),
    st.tuples(st.just("--classes"), BAD_CLASSES),
    st.sampled_from(sorted(TRAIN_NAMES)).flatmap(lambda flag: st.tuples(st.just(flag), unknown(TRAIN_NAMES[flag]))),
)


@settings(PROPERTY, max_examples=150)          # the command with the most flags
@given(flag_value=BAD_TRAIN_FLAG)
def test_train_refuses_a_bad_value_before_training_and_leaves_no_run_folder(flag_value, tmp_path, capsys, no_work):
    flag, value = flag_value
    out = tmp_path / "run"
    assert_refused(*run_cli([*TRAIN, f"{flag}={value}", "--out", out], capsys))
    assert not out.exists()


def test_train_refuses_dense_runs_given_a_bad_density_it_would_have_ignored(tmp_path, capsys, no_work):
    assert_refused(*run_cli([*TRAIN, "--method", "dense", "--density", "nan", "--out", tmp_path / "run"], capsys))


@PROPERTY
@given(data=st.data())
def test_train_refuses_an_out_folder_it_cannot_create_before_training(data, unusable_paths, capsys, no_work):
    out = data.draw(unusable_paths)
    assert_refused(*run_cli([*TRAIN, "--out", out], capsys))
    assert not out.is_dir()


@PROPERTY
@given(other=st.sampled_from([["--data-root", "FILE"], ["--init", "MISSING"], ["--match-compute", "MISSING"],
                              ["--match-compute", "FILE"], ["--init", "FILE"], ["--pflops", "1", "--epochs", "2"],
                              ["--method", "oneshot"], ["--method", "rigl", "--start", "first"]]))
def test_train_refuses_missing_files_and_conflicting_flags(other, tmp_path, capsys, no_work):
    (tmp_path / "file").write_text("neither a folder nor a checkpoint")
    paths = {"FILE": tmp_path / "file", "MISSING": tmp_path / "missing"}
    out = tmp_path / "run"
    assert_refused(*run_cli([*TRAIN, *[paths.get(arg, arg) for arg in other], "--out", out], capsys))
    assert not out.exists()


def test_resume_from_a_foreign_last_checkpoint_is_refused_and_leaves_it_as_it_was(tmp_path, capsys, no_work):
    out = tmp_path / "run"
    out.mkdir()
    (out / "last.pt").write_bytes(b"\x00" * 40)
    assert_refused(*run_cli([*TRAIN, "--resume", "--out", out], capsys))
    assert sorted(p.name for p in out.iterdir()) == ["last.pt"] and (out / "last.pt").read_bytes() == b"\x00" * 40


# --------------------------------------------------------------------------- describe, overhead, bench

BAD_MODEL = st.one_of(unknown(set(MODEL_CONFIGS)),
                      st.sampled_from(["timm:", "timm:no_such_vit", "timm:resnet18", "timm:vit_tiny_patch16_224:bad",
                                       "timm:vit_tiny_patch16_224:patch_size=0", "timm:vit_tiny_patch16_224:num_heads=0",
                                       "timm:vit_tiny_patch16_224:img_size=-1", "timm:vit_tiny_patch16_224:=",
                                       "timm:vit_tiny_patch16_224:depth=x"]))


@PROPERTY
@given(args=st.one_of(st.tuples(BAD_MODEL, st.just("0.5")), st.tuples(st.just("cct-mini"), BAD_DENSITY)))
def test_describe_refuses_bad_models_and_densities(args, capsys):
    model, density = args
    assert_refused(*run_cli(["describe", f"--model={model}", f"--density={density}"], capsys))


@PROPERTY
@given(flag_value=st.one_of(st.tuples(st.just("--model"), unknown(set(MODEL_CONFIGS))),
                            st.tuples(st.just("--density"), BAD_DENSITY),
                            st.tuples(st.sampled_from(["--batch", "--steps"]), NOT_POSITIVE_INTEGER),
                            st.tuples(st.just("--warmup"), st.one_of(numbers(st.integers(max_value=-1)), GARBAGE))))
def test_overhead_refuses_a_bad_value_before_timing(flag_value, capsys, no_work):
    flag, value = flag_value
    assert_refused(*run_cli(["overhead", "--model=cct-mini", f"{flag}={value}"], capsys))


BAD_BENCH_FLAG = st.one_of(
    st.tuples(st.just("--model"), unknown(set(MODEL_CONFIGS))),
    st.tuples(st.just("--methods"), bad_list(unknown(set(METHODS)).filter(lambda s: "," not in s and s.strip()))),
    st.tuples(st.just("--densities"), bad_list(BAD_DENSITY.filter(lambda s: "," not in s))),
    st.tuples(st.sampled_from(["--batch", "--steps", "--segment-steps", "--update-samples"]), NOT_POSITIVE_INTEGER),
    st.tuples(st.just("--warmup"), st.one_of(numbers(st.integers(max_value=-1)), GARBAGE)),
    st.tuples(st.just("--seed"), BAD_SEED),
    st.tuples(st.just("--device"), unknown({"auto", "cpu", "cuda"})),
)


@PROPERTY
@given(flag_value=BAD_BENCH_FLAG)
def test_bench_refuses_a_bad_value_before_measuring_and_writes_no_out_file(flag_value, tmp_path, capsys, no_work):
    flag, value = flag_value
    out = tmp_path / "bench.json"
    assert_refused(*run_cli(["bench", "--model=cct-mini", f"{flag}={value}", "--out", out], capsys))
    assert not out.exists()


def test_bench_densities_are_checked_even_where_only_dense_runs(capsys, no_work):
    assert_refused(*run_cli(["bench", "--model=cct-mini", "--methods=dense", "--densities=nan"], capsys))


@PROPERTY
@given(data=st.data())
def test_bench_and_export_refuse_an_out_file_they_could_not_write_before_working(data, unusable_paths, tmp_path,
                                                                                capsys, no_work):
    out = data.draw(unusable_paths) / "result.json"
    assert_refused(*run_cli(["bench", "--model=cct-mini", "--out", out], capsys))
    assert_refused(*run_cli(["bench", "--model=cct-mini", "--out", tmp_path], capsys))   # a folder
    assert_refused(*run_cli(["export", tmp_path, "--out", out], capsys))


# --------------------------------------------------------------------------- export, data, book

@PROPERTY
@given(checkpoint=st.one_of(st.sampled_from(["best.pt", "last.pt", "../afile", "nope.pt", ""]),
                            st.text(string.ascii_letters + "._", min_size=1, max_size=10)))
def test_export_refuses_a_run_without_that_checkpoint_and_writes_nothing(checkpoint, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / "truncated.pt").write_bytes(b"PK\x03\x04")
    out = tmp_path / "exported.pt"
    assert_refused(*run_cli(["export", tmp_path / "run", "--out", out, f"--checkpoint={checkpoint}"], capsys))
    assert_refused(*run_cli(["export", tmp_path / "run", "--out", out, "--checkpoint=truncated.pt"], capsys))
    assert_refused(*run_cli(["export", tmp_path / "afile", "--out", out], capsys))
    assert not out.exists()


@PROPERTY
@given(dataset=unknown(set(DATASET_NAMES)).filter(lambda s: not s.startswith("-")))
def test_data_refuses_unknown_datasets_and_a_file_as_data_root(dataset, tmp_path, capsys):
    assert_refused(*run_cli(["data", dataset], capsys))
    (tmp_path / "afile").write_text("x")
    assert_refused(*run_cli(["data", "fashion-mnist", "--data-root", tmp_path / "afile"], capsys))


@PROPERTY
@given(data=st.data())
def test_book_refuses_unknown_profiles_and_unusable_build_folders_before_building(data, unusable_paths, capsys,
                                                                                 no_work):
    assert_refused(*run_cli(["book", f"--profile={data.draw(unknown(set(PROFILES)))}"], capsys))
    assert_refused(*run_cli(["book", "--profile=smoke", "--build-dir", data.draw(unusable_paths)], capsys))


# --------------------------------------------------------------------------- notebook parameters

def assert_one_line_error(call, *args) -> None:
    with pytest.raises(BarterError) as info:
        call(*args)
    assert "\n" not in str(info.value).strip()


#: a value of the wrong kind for any parameter: a scalar, text, a mapping, None
WRONG_KIND = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
                       st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
BAD_DENSITY_VALUE = st.one_of(st.floats().filter(lambda x: not 0 < x <= 1), st.floats(min_value=1e-300, max_value=0.05),
                              st.text(max_size=4), st.none(), st.booleans(), st.lists(st.floats(0.1, 1), max_size=2))
BAD_SEED_VALUE = st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32), st.booleans(),
                           st.floats(), st.text(max_size=4), st.none())
GOOD = {"profile": "smoke", "dataset": "default", "densities": [0.3], "seeds": [0]}


def with_bad_item(good: list, bad):
    return bad.map(lambda item: [*good, item])


BAD_PARAMETER = st.one_of(
    st.tuples(st.just("profile"), st.one_of(unknown(set(PROFILES)), WRONG_KIND, st.lists(st.just("quick"), max_size=1))),
    st.tuples(st.just("dataset"), st.one_of(unknown(set(DATASET_NAMES) | {"default"}), WRONG_KIND)),
    st.tuples(st.just("densities"), st.one_of(WRONG_KIND.filter(lambda v: not isinstance(v, (list, tuple))),
                                              st.just([]), with_bad_item([0.3], BAD_DENSITY_VALUE))),
    st.tuples(st.just("seeds"), st.one_of(WRONG_KIND.filter(lambda v: not isinstance(v, (list, tuple))),
                                          st.just([]), with_bad_item([0], BAD_SEED_VALUE))),
)


@PROPERTY
@given(name_value=BAD_PARAMETER)
def test_profile_resolution_refuses_every_bad_notebook_parameter(name_value):
    name, value = name_value
    parameters = {**GOOD, name: value}
    assert_one_line_error(resolve_profile, parameters["profile"], parameters["dataset"],
                          parameters["densities"], parameters["seeds"])


#: a list parameter of names with something wrong: not a list, empty, an unknown or unhashable item
def bad_names(known) -> st.SearchStrategy:
    return st.one_of(WRONG_KIND.filter(lambda v: not isinstance(v, (list, tuple))), st.just([]),
                     st.lists(st.one_of(unknown(set(known)), st.integers(), st.none(),
                                        st.lists(st.just(next(iter(known))), max_size=1)), min_size=1, max_size=3))


@pytest.fixture
def no_runs(monkeypatch):
    """The notebooks' grid functions train through their profile's ``cached_train``: stop them there."""
    import barter_mini.book.profiles as profiles

    def started(*args, **kwargs):
        raise WorkStarted("a run started")
    monkeypatch.setattr(profiles, "cached_train", started)


@PROPERTY
@given(methods=bad_names(METHODS))
def test_method_lists_are_refused_before_any_run(methods, no_runs):
    from barter_mini.book.experiments import run_grid
    assert_one_line_error(run_grid, PROFILES["smoke"], methods, [0.3], [0], False)


@PROPERTY
@given(policies=bad_names(["barter/split", "barter/fresh", "rigl/reset"]))
def test_policy_lists_are_refused_before_any_run(policies, no_runs):
    from barter_mini.book.optimizer_state import run_policies
    assert_one_line_error(run_policies, PROFILES["smoke"], policies, 0.3, [0], False)


@PROPERTY
@given(variants=bad_names(["static", "barter"]).filter(lambda v: v != []),
       profile=st.sampled_from(sorted(PROFILES)))
def test_variant_lists_are_refused(variants, profile):
    from barter_mini.book.reallocation_study import study_defaults
    assert_one_line_error(study_defaults, profile, [0], variants)


@PROPERTY
@given(multipliers=st.one_of(WRONG_KIND.filter(lambda v: not isinstance(v, (list, tuple))), st.just([]),
                             with_bad_item([1, 2], st.one_of(st.floats(max_value=0), st.floats(allow_nan=True).filter(
                                 math.isnan), st.just(math.inf), st.text(max_size=3), st.none()))))
def test_multiplier_lists_are_refused_before_any_run(multipliers, no_runs):
    from barter_mini.book.transfer_counts import run_multipliers
    assert_one_line_error(run_multipliers, PROFILES["smoke"], multipliers, 0.5, [0], False)
