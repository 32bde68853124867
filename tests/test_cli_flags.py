"""The commands that describe or measure one model share one definition of ``--model`` and
``--density``: RunConfig's help, parsers and density default, and one measured model."""

from barter_mini.cli import build_parser
from barter_mini.cli.arguments import MEASURED_MODEL
from barter_mini.training.run_config import RunConfig


def _action(command: str, flag: str):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return next(a for a in sub._actions if flag in a.option_strings)


def test_describe_bench_and_overhead_share_model_and_density():
    parser = build_parser()
    for command in ("describe", "bench", "overhead"):
        args = parser.parse_args([command])
        assert args.model == MEASURED_MODEL, command
    for command in ("describe", "overhead"):
        assert parser.parse_args([command]).density == RunConfig().density
        assert _action(command, "--density").help == _action("train", "--density").help
    helps = {_action(command, "--model").help for command in ("describe", "bench", "overhead")}
    assert len(helps) == 1 and helps.pop().startswith(_action("train", "--model").help)
