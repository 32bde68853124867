import os
from pathlib import Path

import pytest
from hypothesis import settings

from barter_mini.core.configs import ModelConfig
from barter_mini.core.models import get_model_config

from helpers import TINY_CCT, TINY_VIT


#: the environment variable that picks the hypothesis profile of the property tests
PROFILE_ENV = "HYPOTHESIS_PROFILE"
#: how many times a test's own examples the fuzz profile draws
FUZZ_FACTOR = 10
# "ci" (the default, `make test`): every property test draws the same examples on every run
# (derandomized: a fixed seed), so a failure is a change's, never the draw's. "fuzz" (`make
# fuzz`, the developer's own lane): fresh examples on every run, FUZZ_FACTOR times as many,
# kept in .hypothesis/ so a failure found once is tried first the next time.
settings.register_profile("ci", derandomize=True)
settings.register_profile("fuzz", derandomize=False, max_examples=FUZZ_FACTOR * settings.default.max_examples)
settings.load_profile(os.environ.get(PROFILE_ENV, "ci"))


def pytest_configure(config):
    config.addinivalue_line("markers", "property: a hypothesis property test (`make fuzz` runs these alone)")


def fuzzed(test) -> None:
    """Under the fuzz profile, a property test whose own ``@settings`` fix its seed or its
    number of examples draws fresh examples, :data:`FUZZ_FACTOR` times as many (a test's own
    settings otherwise win over the profile's; one without them has the profile's already)."""
    test = getattr(test, "__func__", test)          # a test method: its function
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if own is None or getattr(test, "fuzzed", False):      # parametrized: one function, many items
        return
    test.fuzzed = True
    examples = own.max_examples
    test._hypothesis_internal_use_settings = settings(
        own, derandomize=False,
        max_examples=examples if examples == settings.default.max_examples else FUZZ_FACTOR * examples)


@pytest.fixture(params=["cct", "vit"])
def tiny_config(request) -> ModelConfig:
    return TINY_CCT if request.param == "cct" else TINY_VIT


@pytest.fixture
def paper_cct() -> ModelConfig:
    return get_model_config("cct-paper")


#: tests of five seconds or more on two cores (a fresh clone's `make test
#: PYTEST_ARGS=--junitxml=...`), beside the modules marked ``slow`` in their own file: the
#: fast lane (`make test-fast`, ``pytest -m "not slow"``) leaves them out; `make test` runs all
SLOW_TESTS = (
    "test_bench.py::test_the_gpu_check_fits_its_budget_by_count",
    "test_sweep.py::test_sweep_survives_a_killed_run_and_a_failed_one",
    "test_train.py::test_issue_command_on_fashion_mnist",
    "test_train.py::test_train_writes_metrics_and_checkpoints",
    "test_train.py::test_a_piled_start_is_where_a_compact_run_begins",
    "test_train.py::test_bad_train_input_is_a_one_line_error_and_writes_nothing",
    "test_train.py::test_missing_dataset_says_how_to_get_it",
    "test_execution.py::test_train_with_compile_or_recompute",
    "test_execution.py::test_inductor_compiled_layers_match_the_plain_model",
    "test_execution.py::test_a_schedule_of_topology_updates_reuses_a_few_graphs",
    "test_notebooks.py::test_bad_parameter_fails_with_the_library_error",
    "test_cifar10.py::test_the_decoded_arrays_are_cifar10s_batches",
    "test_adversarial.py::test_a_damaged_cache_entry_is_reported_and_trained_again",
    "test_adversarial.py::test_two_runs_started_together_into_one_folder",
    "test_adversarial.py::test_every_load_site_refuses_a_planted_payload",
    "test_ddp.py::test_a_rank_divergence_fails_loudly_on_every_process",
    "test_validation.py::test_train_out_that_cannot_be_created_is_a_one_line_error",
    "test_validation.py::test_truncated_or_foreign_checkpoints_are_one_line_errors",
    "test_hostile_inputs.py::test_a_data_root_without_permission_is_one_line",
    "test_dense_start.py::test_the_cli_fine_tunes_barter_from_a_timm_checkpoint_file",
    "test_layers.py::test_bench_runs_without_the_book_extra",
    "test_budgets.py::test_describe_json_has_params_and_gflops",
    "test_budgets.py::test_describe_text_lists_every_layer",
    "test_bench.py::test_the_profiler_writes_no_log_lines_to_stderr",
    "test_one_line_errors.py::test_the_room_refuses_a_jobs_count_below_one_in_one_line",
    "test_one_line_errors.py::test_the_room_says_that_record_trains_nothing_when_given_a_dry_run",
    "test_one_line_errors.py::test_recording_the_room_from_an_empty_cache_is_one_line_and_writes_nothing",
    "test_one_line_errors.py::test_a_notebook_at_a_bad_density_fails_in_one_line_that_points_at_the_executed_notebook",
)


def pytest_collection_modifyitems(config, items):
    fuzzing = os.environ.get(PROFILE_ENV, "ci") == "fuzz"
    for item in items:
        if item.nodeid.split("[")[0].removeprefix("tests/") in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        test = getattr(item, "obj", None)
        if getattr(test, "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
            if fuzzing:
                fuzzed(test)


@pytest.fixture(scope="session")
def book_html(tmp_path_factory) -> Path:
    """The html folder of the smoke book the browser tests read: ``$BARTER_MINI_BOOK_HTML``
    or one fresh build, shared by every test module that asks."""
    prebuilt = os.environ.get("BARTER_MINI_BOOK_HTML")
    if prebuilt:
        path = Path(prebuilt).resolve()
        assert (path / "index.html").is_file(), f"BARTER_MINI_BOOK_HTML={prebuilt} has no index.html"
        return path
    from barter_mini.book.build import build_book

    return Path(build_book("smoke", tmp_path_factory.mktemp("book"))).parent
