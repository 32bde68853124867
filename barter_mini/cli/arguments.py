"""The command line's arguments: how each kind of value is read (one-line errors that say
what is allowed), and the flags of :class:`~barter_mini.training.run_config.RunConfig`'s
settings (:func:`add_run_settings`, read back by :func:`run_from_args`)."""

from __future__ import annotations

import argparse
import math
import dataclasses
import json
from pathlib import Path

from ..errors import MAX_SEED, BarterError, check_integer, check_seed, positive_int, shown_path
from ..training.checkpoints import check_can_create
from ..training.data import parse_classes
from ..training.run_config import RunConfig


def comma_list(convert, what: str):
    def parse(text: str) -> list:
        try:
            return [convert(item) for item in text.split(",") if item.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, got {text!r}")
    return parse


#: the deepest nesting of a ``--parameter`` value's lists and objects (a notebook's
#: parameters are numbers, strings and lists of them)
MAX_PARAMETER_DEPTH = 16


def json_depth(value) -> int:
    """How many lists and dicts ``value`` nests (0 for a number or a string, 1 for
    ``[0, 1, 2]``), counted without recursion, so no nesting reaches Python's recursion limit."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            pending += [(child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return deepest


def notebook_parameter(text: str) -> tuple[str, object]:
    name, equals, value = text.partition("=")
    if not (name.isidentifier() and equals):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (VALUE in JSON, e.g. seeds=[0,1,2]), got {text!r}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return name, value          # a bare word: a string, as papermill reads cifar10
    except (ValueError, RecursionError, MemoryError) as error:   # too many digits, too deep for the parser
        raise argparse.ArgumentTypeError(f"{name}'s value cannot be read as JSON ({type(error).__name__}): give "
                                         f"numbers, strings and lists nested at most {MAX_PARAMETER_DEPTH} deep, "
                                         "e.g. seeds=[0,1,2]") from None
    depth = json_depth(parsed)
    if depth > MAX_PARAMETER_DEPTH:
        raise argparse.ArgumentTypeError(f"{name}'s value nests {depth} lists or objects deep: give "
                                         f"numbers, strings and lists nested at most {MAX_PARAMETER_DEPTH} deep, "
                                         "e.g. seeds=[0,1,2]")
    return name, parsed


#: how to install the libraries the book's commands need beside the package's own
BOOK_INSTALL = "pip install -e '.[book]' (make install does)"


def papermill_value(text: str):
    """A ``-p NAME VALUE``'s value as papermill's own ``-p`` reads it, so that a command
    written for papermill means the same: ``True``, ``False``, ``None``, an int, a float, else
    the text itself."""
    named = {"True": True, "False": False, "None": None}
    if text in named:
        return named[text]
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def yaml_parameters(text: str) -> dict:
    """A ``-y YAML`` option: a mapping of parameter names to values, as papermill's ``-y``."""
    try:
        import yaml
    except ImportError:
        raise argparse.ArgumentTypeError(f"-y needs PyYAML, one of the book's libraries: {BOOK_INSTALL}") from None
    try:
        parsed = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as error:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as YAML ({type(error).__name__}): give a mapping "
                                         'such as "{seeds: [0, 1, 2]}"') from None
    if not isinstance(parsed, dict) or not all(isinstance(name, str) for name in parsed):
        raise argparse.ArgumentTypeError(f'expected a YAML mapping of parameter names such as "{{seeds: [0, 1, 2]}}", '
                                         f"got {text!r}")
    return parsed


def non_negative_int(text: str) -> int:
    try:
        return check_integer("the value", int(text), minimum=0)
    except (ValueError, BarterError):
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def seed(text: str) -> int:
    try:
        return check_seed("the seed", int(text))
    except (ValueError, BarterError):
        raise argparse.ArgumentTypeError(f"expected a seed, an integer in [0, {MAX_SEED}], got {text!r}") from None


def output_file(text: str) -> str:
    """A file to write at the end of the work: refused at once if it could not be written then."""

    path = Path(text)
    try:
        is_folder = path.is_dir()
    except OSError as error:            # a name too long
        raise argparse.ArgumentTypeError(f"cannot write {shown_path(text)}: "
                                         f"{error.strerror or type(error).__name__}") from None
    if is_folder:
        raise argparse.ArgumentTypeError(f"{shown_path(text)} is a folder: give a file name")
    try:
        check_can_create(path.parent)
    except BarterError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def data_root(text: str) -> str:
    """A data root that is a folder or may become one; whether it can be written is only
    asked where a dataset must be fetched into it (a read-only root that holds the data serves)."""
    try:
        not_a_folder = Path(text).exists() and not Path(text).is_dir()
    except OSError as error:            # a parent folder we may not enter, a name too long
        raise argparse.ArgumentTypeError(f"cannot use {shown_path(text)} as the data root: "
                                         f"{error.strerror or type(error).__name__}") from None
    if not_a_folder:
        raise argparse.ArgumentTypeError(f"{text} is a file: give the folder that holds the datasets")
    return text


def density(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"density must be a number in (0, 1], got {text!r}")


def classes(text: str) -> tuple[int, ...]:
    try:
        return parse_classes(text)
    except BarterError as error:
        raise argparse.ArgumentTypeError(str(error))


#: the run settings a sweep's grid takes as flags, beside its methods, densities and seeds
GRID_SETTINGS = ("model", "dataset", "recipe", "epochs", "train_subset", "start", "data_root", "download", "device",
                 "precision")


#: how a run setting's kind of value (training.run_config.KINDS) is parsed on the command line
def setting_parsers() -> dict:
    return {"str": str, "int": int, "float": float, "positive_int": positive_int, "density": density,
            "classes": classes}


def flag_of(spec: dataclasses.Field) -> str:
    """The command-line flag of a RunConfig field: its own (``--no-progress``) or ``--field-name``."""
    return spec.metadata["flag"] or "--" + spec.name.replace("_", "-")


def help_of(spec: dataclasses.Field) -> str:
    text = spec.metadata["help"]
    return text() if callable(text) else text


def run_setting_flag(parser, spec: dataclasses.Field, grid: bool = False, default=dataclasses.MISSING) -> None:
    """The flag of one :class:`~barter_mini.training.run_config.RunConfig` field, from its
    metadata (help, kind, flag name); ``grid``: a sweep's flag, unset unless given (the grid
    applies the field's default, which the help names); ``default``: another default than
    the field's (a command that measures rather than trains), which the help names."""
    meta = spec.metadata
    flag, help_text = flag_of(spec), help_of(spec)
    if meta["kind"] == "bool":           # a flag that sets the field, or (--no-...) clears it
        parser.add_argument(flag, action="store_true", help=help_text)
        return
    if default is dataclasses.MISSING:
        default = spec.default if spec.default is not dataclasses.MISSING else None
    else:
        help_text = f"{help_text} (default {default})"
    if grid and default is not None:
        help_text, default = f"{help_text} (default {default})", None
    parser.add_argument(flag, type=setting_parsers()[meta["kind"]], default=default, help=help_text,
                        metavar=meta["metavar"])


#: the model the commands that describe or measure a model (describe, bench, overhead) take
#: unless told: the paper's CCT, whose numbers Tables 6 and 8 report
MEASURED_MODEL = "cct-paper"


def add_model_flags(parser: argparse.ArgumentParser, density: bool = True) -> None:
    """``--model`` (default :data:`MEASURED_MODEL`) and, with ``density``, ``--density``:
    :class:`~barter_mini.training.run_config.RunConfig`'s flags, with its help, parsers and
    density default, for every command that describes or measures one model."""
    specs = {spec.name: spec for spec in dataclasses.fields(RunConfig)}
    run_setting_flag(parser, specs["model"], default=MEASURED_MODEL)
    if density:
        run_setting_flag(parser, specs["density"])


def add_run_settings(parser: argparse.ArgumentParser, names=None) -> None:
    """A flag for every :class:`~barter_mini.training.run_config.RunConfig` field that has one
    (or for the fields ``names``, as a sweep's grid flags)."""

    for spec in dataclasses.fields(RunConfig):
        if spec.metadata.get("cli", False) and (names is None or spec.name in names):
            run_setting_flag(parser, spec, grid=names is not None)


def run_from_args(args: argparse.Namespace):
    """The :class:`~barter_mini.training.run_config.RunConfig` the flags of :func:`add_run_settings` give."""

    values = {}
    for spec in dataclasses.fields(RunConfig):
        if not spec.metadata.get("cli", False):
            continue
        flag = flag_of(spec)
        value = getattr(args, flag[2:].replace("-", "_"))
        values[spec.name] = (not value) if flag.startswith("--no-") else value
    return RunConfig(**values)
