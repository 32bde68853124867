"""Tables as a reader sees them on a page: headers in words, no index column of row numbers,
blank cells where there is no number, numbers formatted by their kind.

:func:`page_table` styles one frame; :func:`use_page_tables` makes every DataFrame a notebook
displays go through it, so a chapter's cells can end with the frame they computed (the CSV
files keep the raw columns). :func:`settings_markdown` shows a settings object (a profile, a
chapter's setup) as a two-column Markdown table.
"""

from __future__ import annotations

import math
from dataclasses import fields

import pandas as pd

#: the words for the raw column names the book's frames carry: the one place a column's header
#: is written, for the tables :func:`page_table` shows and for the column lists of
#: :mod:`barter_mini.book.report` (a name not listed reads with its underscores as spaces).
#: Headers break at spaces: a page's content column is under 700 pixels wide on a 1280-pixel
#: screen, and a header such as "train_gflops_per_image" cannot wrap.
HEADERS = {
    "acc": "test Top-1 (%)", "f1": "test macro-F1 (%)", "val_acc": "validation Top-1 (%)",
    "acc_mean": "test Top-1 (%)", "acc_std": "test Top-1 std", "f1_mean": "test macro-F1 (%)", "f1_std": "test macro-F1 std",
    "acc_diff": "Top-1 difference (points)", "f1_diff": "macro-F1 difference (points)",
    "acc_diff_sd": "paired sd (points)", "paired_seeds": "paired seeds",
    "wall_time_s": "wall time (s)", "seeds": "seeds", "params": "parameters",
    "heads_planned": "heads planned", "ffn_planned": "FFN channels planned",
    "head_transfers": "heads moved", "ffn_transfers": "FFN channels moved",
    "update_ms_per_step": "update ms/step", "update_s_per_schedule": "update s per schedule",
    "update_ms": "ms/update", "updates_per_schedule": "updates per schedule",
    "update_percent_of_training": "updates (% of training)", "pflops": "PFLOPs", "s_per_epoch_mean": "s/epoch",
    "train_gflops_per_image": "GFLOPs per image", "paper_train_gflops_per_image": "paper GFLOPs per image",
    "counted_train_gflops_per_image": "counted GFLOPs (fwd + bwd)",
    "params_m": "params (M)", "paper_params_m": "paper params (M)",
    "step_ms": "ms/step", "source": "Top-1 from", "epoch_s": "s/epoch", "peak_mem_mb": "peak memory (MB)",
    "speedup": "speedup per step", "epoch_speedup": "speedup per epoch", "ideal_speedup": "FLOPs-ideal speedup",
    "step_speedup": "speedup", "memory_fraction": "memory share",
    "fixed_ms": "fixed ms/step", "fixed_share": "fixed share", "rigl_fixed_ms": "RigL's fixed ms/step",
    "efficiency_without_fixed": "efficiency without it",
    "compile_s": "compile (s)", "compile_s_per_schedule": "schedule (s)",
}


def column_words(name: str) -> str:
    """The header of raw column ``name`` (:data:`HEADERS`)."""
    return HEADERS.get(name, name.replace("_", " "))


#: a float column whose non-zero magnitudes span more than this factor is shown with
#: significant digits (15.3 beside 2.49e-05) rather than a fixed number of decimals
SPAN_FOR_SIGNIFICANT = 1e3


def _header(label, axis_name=None) -> str:
    if isinstance(label, tuple):
        return ", ".join(_header(part) for part in label if str(part) != "")
    if isinstance(label, str):
        return column_words(label)
    named = HEADERS.get(axis_name, str(axis_name).replace("_", " ")) if axis_name else ""
    return f"{named} {label:g}".strip() if isinstance(label, float) else f"{named} {label}".strip()


#: a float column already rounded to at most this many decimals keeps them
MAX_DECIMALS = 4


def _decimals_of(values: list[float], default: int) -> int:
    """The decimals a column was rounded to (the fewest that represent every value), or
    ``default`` for a column that was never rounded."""
    for places in range(MAX_DECIMALS + 1):
        if all(round(v, places) == v for v in values):
            return places
    return default


def _float_format(values: pd.Series, decimals: int):
    finite = [float(v) for v in values if math.isfinite(v)]
    magnitudes = [abs(v) for v in finite if v != 0]
    if magnitudes and max(magnitudes) / min(magnitudes) > SPAN_FOR_SIGNIFICANT:
        return lambda v: _unsigned_zero(f"{v:.3g}")
    places = _decimals_of(finite, decimals)
    if magnitudes and max(magnitudes) < 10 ** -places:   # every value would read 0.00
        return lambda v: f"{v:.2e}"
    return lambda v: _unsigned_zero(f"{v:,.{places}f}")


def listed(words) -> str:
    """Words as a sentence lists them: ``a``, ``a and b``, ``a, b and c`` ('' for none)."""
    words = list(words)
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def signed(value: float) -> str:
    """A gap in a sentence: two decimals with its sign, except one that rounds to zero, which
    has none (``0.00``, never ``-0.00`` or ``+0.00``)."""
    return "0.00" if round(value, 2) == 0 else f"{value:+.2f}"


def _unsigned_zero(text: str) -> str:
    """``-0.000`` (a tiny negative rounded away) reads ``0.000``: a zero has no sign."""
    return text[1:] if text.startswith("-") and not any(c in "123456789" for c in text) else text


def page_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its index made real columns (a named or labelled index) or dropped (row
    numbers 0..n-1), and its headers in words (:data:`HEADERS`; a numeric column label
    prefixed by its axis name, e.g. "density 0.3"; a multi-level header keeps its levels as
    header rows, each label in words)."""
    if isinstance(frame.index, pd.RangeIndex) and frame.index.start == 0 and frame.index.step == 1:
        shown = frame.reset_index(drop=True)
    elif frame.index.nlevels == 1 and frame.index.name is None:
        shown = frame.rename_axis("").reset_index()      # labels without a name: a blank header
    else:
        shown = frame.reset_index()
    if isinstance(shown.columns, pd.MultiIndex):   # kept as header rows: short labels, narrow columns
        shown.columns = pd.MultiIndex.from_tuples(
            [tuple(_header(part) if isinstance(part, str) else f"{part:g}" if isinstance(part, float) else str(part)
                   for part in label) for label in shown.columns])
    else:
        shown.columns = [_header(label, frame.columns.name) for label in shown.columns]
    return shown


def page_table(frame: pd.DataFrame, decimals: int = 2):
    """``frame`` as the page shows it (:func:`page_frame`), styled: no index column, a blank
    cell where a value is missing, integers with thousands separators, floats with the
    decimals they were rounded to (``decimals`` where they never were), or with significant
    digits in a column of very different magnitudes."""
    shown = page_frame(frame)
    formats = {}
    for column in shown.columns:
        values = shown[column]
        if pd.api.types.is_bool_dtype(values):
            formats[column] = lambda v: "yes" if v else "no"
        elif pd.api.types.is_integer_dtype(values):
            formats[column] = lambda v: f"{v:,}"
        elif pd.api.types.is_float_dtype(values):
            formats[column] = _float_format(values, decimals)
    # the "dataframe" class gives it the compact table style myst-nb gives pandas' own tables
    return shown.style.hide(axis="index").format(formats, na_rep="").set_table_attributes('class="dataframe"')


def _html(frame: pd.DataFrame) -> str:
    return page_table(frame).to_html()


def use_page_tables() -> None:
    """Render every DataFrame this notebook displays with :func:`page_table` (IPython's HTML
    formatter; outside IPython nothing changes)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, _html)


def settings_markdown(settings, title: str, none_means: dict[str, str] | None = None, leave_out=()) -> str:
    """A settings dataclass as a small Markdown table (setting, value) for a notebook page,
    without the fields named in ``leave_out``; a None value reads as ``none_means[field]``
    (e.g. "all"), else as a dash."""
    none_means = none_means or {}
    rows = [f"| {field.name.replace('_', ' ')} | "
            f"{_setting_text(getattr(settings, field.name), none_means.get(field.name))} |" for field in fields(settings)
            if field.name not in leave_out]
    return "\n".join([f"**{title}**", "", "| setting | value |", "|---|---|", *rows])


def _setting_text(value, none_means: str | None = None) -> str:
    if value is None:
        return none_means or "-"
    if isinstance(value, tuple):
        return ", ".join(f"({_setting_text(v)})" if isinstance(v, tuple) else _setting_text(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return f"`{value}`"
    return f"{value:,}" if isinstance(value, int) else str(value)
