import pytest

from barter_mini.core.configs import ModelConfig
from barter_mini.core.models import get_model_config

from helpers import TINY_CCT, TINY_VIT


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
    "test_report.py::test_vit_rows_never_carry_the_cct_papers_numbers",
    "test_layers.py::test_bench_runs_without_the_book_extra",
    "test_budgets.py::test_describe_json_has_params_and_gflops",
    "test_budgets.py::test_describe_text_lists_every_layer",
    "test_bench.py::test_the_profiler_writes_no_log_lines_to_stderr",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.split("[")[0].removeprefix("tests/") in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
