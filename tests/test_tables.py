"""Tables on a page: headers in words, no row numbers, blanks for missing values, numbers by kind."""

from __future__ import annotations

import numpy as np
import pandas as pd

from barter_mini.book.tables import page_frame, page_table


def test_a_table_has_words_no_row_numbers_and_blanks():
    frame = pd.DataFrame({"method": ["rigl", "barter"], "acc_diff": [-0.5, np.nan], "params": [1234567, 89],
                          "update_ms_per_step": [0.0844, 0.0123], "pflops": [15.27612, 2.49e-05]})
    html = page_table(frame).to_html()
    assert "Top-1 difference (points)" in html and "acc_diff" not in html and "update ms/step" in html
    assert "<th" in html and "row0" in html and ">0</th>" not in html        # no index cells
    assert "nan" not in html.lower().replace("nancial", "")
    assert "1,234,567" in html and ">89<" in html
    assert "0.0844" in html and "0.0123" in html                 # rounded to 4 decimals, kept
    assert "15.3" in html and "2.49e-05" in html                 # very different magnitudes


def test_a_named_index_becomes_a_column_and_numeric_labels_read_as_settings():
    pivot = pd.DataFrame({"method": ["barter", "rigl"], "density": [0.1, 0.1], "value": [1.0, 2.0]}).pivot(
        index="method", columns="density", values="value")
    shown = page_frame(pivot)
    assert list(shown.columns) == ["method", "density 0.1"] and list(shown["method"]) == ["barter", "rigl"]
    labelled = pd.Series({"val_acc": 0.5}).to_frame("value")
    assert list(page_frame(labelled).columns) == ["", "value"] and page_frame(labelled).iloc[0, 0] == "val_acc"
    multi = page_frame(pd.concat({("cct-paper", "peak_mem_mb"): pivot}, axis=1))
    assert list(multi.columns) == [("method", "", ""), ("cct-paper", "peak memory (MB)", "0.1")]
    html = page_table(pd.concat({("cct-paper", "ms/step"): pivot}, axis=1)).to_html()
    assert html.count("<tr>") >= 3 + 2 and "<th" not in html.split("<tbody>")[1]   # header rows, no index
    assert 'class="dataframe"' in html and ">0.1</th>" in html
