"""The contributors' fast lane (`make test-fast`): every test it leaves out is named, and it
keeps the core, the surgery, the statistics, the methods' rules and the CLI."""

import subprocess
import sys
from pathlib import Path

from conftest import SLOW_TESTS

TESTS = Path(__file__).resolve().parent


def _collected(*marker: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *marker, str(TESTS)], capture_output=True, text=True, cwd=TESTS.parent, timeout=300).stdout
    return {line.split("[")[0].removeprefix("tests/") for line in out.split() if "::" in line}


def test_every_slow_test_named_exists_and_the_fast_lane_keeps_the_core():
    everything, fast = _collected(), _collected("-m", "not slow")
    assert not [name for name in SLOW_TESTS if name not in everything]
    assert not fast & set(SLOW_TESTS) and not any(name.startswith("test_book_browser.py") for name in fast)
    kept = {name.split("::")[0] for name in fast}
    assert {"test_barter.py", "test_surgery.py", "test_statistics.py", "test_masked.py", "test_protocol.py",
            "test_budgets.py", "test_bad_input.py"} <= kept
