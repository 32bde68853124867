"""Chapters 02 and 03 end with conclusions composed from their own tables."""

from __future__ import annotations

import pandas as pd
import pytest

from barter_mini.book.findings import ablation_findings, from_scratch_findings


def _summary(seeds: int) -> pd.DataFrame:
    rows = [("dense", 1.0, 70.0), ("rigl", 0.3, 61.0), ("set", 0.3, 62.5), ("static", 0.3, 60.0),
            ("barter", 0.3, 61.5), ("rigl", 0.1, 55.0), ("barter", 0.1, 54.0)]
    return pd.DataFrame([{"method": m, "density": d, "acc_mean": a, "acc_std": 0.1, "f1_mean": a, "f1_std": 0.1,
                          "seeds": seeds, "wall_time_s": 1.0} for m, d, a in rows])


def test_from_scratch_findings_state_rank_and_gaps_per_density():
    paper = pd.DataFrame([{"method": m, "density": 0.3, "acc_mean": a} for m, a in
                          (("rigl", 71.74), ("barter", 71.38), ("static", 70.43), ("set", 70.0))])
    text = from_scratch_findings(_summary(seeds=1), paper)
    rho3 = next(line for line in text.splitlines() if "rho = 0.3" in line)
    assert "BARTER 61.50 % test Top-1, rank 2 of 4 sparse methods (the paper: 2 among the same methods)" in rho3
    assert "+1.50 points over Static" in rho3
    assert "-1.00 points over the best masked method (set, 62.50 %)" in rho3
    rho1 = next(line for line in text.splitlines() if "rho = 0.1" in line)
    assert "rank 2 of 2" in rho1 and "the paper" not in rho1 and "Static" not in rho1
    assert "single runs (one seed)" in text
    assert "Means over 3 seeds" in from_scratch_findings(_summary(seeds=3), paper)


def test_from_scratch_gaps_are_paired_by_seed_against_the_noise():
    from barter_mini.book.experiments import summarize
    runs = pd.DataFrame([{"method": m, "density": 0.3, "seed": s, "acc": acc, "f1": acc, "wall_time_s": 1.0}
                         for m, accs in (("barter", (60, 62, 61)), ("static", (59, 61, 60)), ("rigl", (61, 60, 64)))
                         for s, acc in enumerate(accs)])
    text = from_scratch_findings(summarize(runs), pd.DataFrame(columns=["method", "density", "acc_mean"]), runs)
    assert "+1.00 points over Static (paired by seed sd 0.00: beyond the seed noise)" in text
    assert "-0.67 points over the best masked method (rigl, 61.67 %) (paired by seed sd 2.52: within the seed noise)" in text
    assert "paired" not in from_scratch_findings(summarize(runs[runs["seed"] == 0]), pd.DataFrame(
        columns=["method", "density", "acc_mean"]), runs[runs["seed"] == 0])


def test_the_introductions_from_scratch_sentence_names_ranks_gaps_and_the_noise():
    from barter_mini.book.experiments import summarize
    from barter_mini.book.findings import from_scratch_headline
    runs = pd.DataFrame([{"method": m, "density": d, "seed": s, "acc": acc + 10 * d, "f1": acc, "wall_time_s": 1.0}
                         for d in (0.1, 0.3)
                         for m, accs in (("barter", (60, 62, 61)), ("static", (59, 61, 60)), ("rigl", (61, 60, 64)),
                                         ("set", (50, 51, 52)))
                         for s, acc in enumerate(accs)])
    assert from_scratch_headline(summarize(runs), runs) == (
        "Trained from scratch at rho = 0.1 and 0.3 (3 seeds per point), BARTER ranks 2 and 2 of the 4 sparse "
        "methods; BARTER minus its own frozen allocation (Static) is +1.00 and +1.00 points, beyond the seed noise "
        "at rho 0.1 and rho 0.3; minus the best masked method (rigl), -0.67 and -0.67 points, within the seed "
        "noise at every density.")
    one = runs[runs["seed"] == 0]
    assert from_scratch_headline(summarize(one), one).endswith(
        "(rigl), -1.00 and -1.00 points, on one seed, which cannot tell a gap from the seed noise.")
    assert "(1 seed per point)" in from_scratch_headline(summarize(one), one)
    assert from_scratch_headline(summarize(runs[runs["method"] != "barter"]), runs).startswith("BARTER was not among")


def test_from_scratch_findings_without_barter_say_so():
    summary = _summary(seeds=1)
    assert "BARTER was not among" in from_scratch_findings(summary[summary["method"] != "barter"], summary)


def test_ablation_findings_compare_signs_with_table_12():
    ours = pd.DataFrame({"method": ["static", "random_receiver"], "acc_diff": [-0.8, 0.3]})
    paper = pd.DataFrame({"method": ["static", "random_receiver"], "acc_diff": [-1.05, -0.36]})
    moved = pd.DataFrame({"method": ["barter", "barter", "static"], "seed": [0, 1, 0],
                          "heads moved": [2, 4, 0], "FFN channels moved": [10, 20, 0]})
    text = ablation_findings(ours, paper, moved, seeds=2)
    assert "**static**: -0.80 points of test Top-1 against BARTER (the paper: -1.05 points; the same sign)" in text
    assert "**random_receiver**: +0.30 points" in text and "the opposite sign" in text
    assert "1 of 2 variants ended below BARTER here; in the paper 2 of the 2 it reports did." in text
    assert "barter 3 heads and 15 FFN channels; static 0 heads and 0 FFN channels" in text
    assert "Means over 2 seeds" in text


def test_ablation_gaps_are_paired_by_seed_and_told_from_the_noise():
    from barter_mini.book.experiments import ablation_differences
    runs = pd.DataFrame([{"method": m, "seed": s, "acc": acc, "f1": acc}
                         for m, accs in (("barter", (50, 52, 54)), ("static", (49, 51, 53)),
                                         ("random-pair", (51, 50, 55)))
                         for s, acc in enumerate(accs)])
    ours = ablation_differences(runs).set_index("method")
    assert ours.loc["static", "acc_diff"] == -1 and ours.loc["static", "acc_diff_sd"] == 0   # every seed 1 lower
    assert ours.loc["random-pair", "acc_diff_sd"] == pytest.approx(pd.Series([1, -2, 1]).std())
    text = ablation_findings(ours.reset_index(), pd.DataFrame({"method": [], "acc_diff": []}), pd.DataFrame(), 3)
    assert "**static**: -1.00 points of test Top-1 against BARTER, paired by seed sd 0.00: beyond the seed noise" in text
    assert "**random-pair**: 0.00 points" in text and "sd 1.73: within the seed noise" in text
    assert "1 of the 2 gaps is beyond twice its standard error over 3 seeds" in text
    one_seed = ablation_differences(runs[runs["seed"] == 0])
    assert one_seed["acc_diff_sd"].isna().all()
    assert "seed noise" not in ablation_findings(one_seed, pd.DataFrame({"method": [], "acc_diff": []}),
                                                 pd.DataFrame(), 1).split("\n")[0]


def _multiplier_runs(seeds=(0, 1)) -> pd.DataFrame:
    rows = []
    for multiplier, acc, cost, ffn in ((1.0, 60.0, 0.02, 10), (4.0, 61.0, 0.08, 40)):
        for seed in seeds:
            rows.append({"multiplier": multiplier, "seed": seed, "acc": acc + 0.1 * seed, "f1": acc,
                         "update_ms_per_step": cost, "head_transfers": 1, "ffn_transfers": ffn})
    return pd.DataFrame(rows)


def test_transfer_counts_conclusion_and_figure():
    import matplotlib
    matplotlib.use("Agg")
    from barter_mini.book.transfer_counts import plot_multipliers, what_this_showed
    text = what_this_showed(_multiplier_runs())
    assert "4x moved 1 head and 40 FFN channels against 1 and 10 at 1x, and changed test Top-1 by +1.00 points" in text
    assert "(the paper, ViT/Tiny-ImageNet: +0.53)" in text
    assert "0.020 ms per training step at 1x and 0.080 ms at 4x (4.0x); the paper's grew 4.1x" in text
    assert "Paired by seed over 2 seeds, the gain's sd is 0.00: beyond the seed noise" in text
    noisy = _multiplier_runs().assign(acc=[60.0, 62.0, 61.0, 61.5])          # gains +1.0 and -0.5
    assert "the gain's sd is 1.06: within the seed noise" in what_this_showed(noisy)
    assert "decides nothing" in what_this_showed(_multiplier_runs(seeds=(0,)))
    assert "nothing to compare" in what_this_showed(_multiplier_runs().query("multiplier == 1"))
    figure = plot_multipliers(noisy)
    gain_ax, cost_ax = figure.axes
    labels = sorted(t.get_text() for t in gain_ax.get_legend().get_texts())
    assert labels == ["barter, here (mean ± std of the gain paired by seed)", "paper, ViT/Tiny-ImageNet (Table 16)"]
    assert list(gain_ax.get_xticks()) == [1, 2, 4, 6]
    bars = gain_ax.containers[0]                      # the error bars: the paired gains' std, 0 at 1x
    lows = [segment[0][1] for segment in bars.lines[2][0].get_segments()]
    highs = [segment[1][1] for segment in bars.lines[2][0].get_segments()]
    assert [round(h - l, 2) for l, h in zip(lows, highs)] == [0.0, round(2 * pd.Series([1.0, -0.5]).std(), 2)]


def test_efficiency_conclusion_states_speedup_ideal_and_memory():
    from barter_mini.book.efficiency import what_this_showed
    comparison = pd.DataFrame([
        {"model": "cct-paper", "execution": "eager", "density": 0.1, "speedup": 3.0, "ideal_speedup": 9.0,
         "efficiency": 1 / 3, "memory_fraction": 0.4, "update_percent_of_training": 0.02},
        {"model": "cct-paper", "execution": "eager", "density": 0.5, "speedup": 1.8, "ideal_speedup": 2.0,
         "efficiency": 0.9, "memory_fraction": 0.7, "update_percent_of_training": 0.05},
        {"model": "cct-paper", "execution": "recompute", "density": 0.1, "speedup": 9.0, "ideal_speedup": 9.0,
         "efficiency": 1.0, "memory_fraction": 0.1, "update_percent_of_training": 0.0}])
    text = what_this_showed(comparison, "cpu")
    assert ("**cct-paper** on cpu: at rho = 0.1 3.00x faster per step than RigL (FLOPs ideal 9.00x, so 33 % of it) "
            "with 40 % of RigL's peak memory; at rho = 0.5 1.80x") in text
    assert "at most 0.05 % of training time" in text and "9.00x faster" not in text
    assert "nothing to compare" in what_this_showed(comparison[comparison["execution"] == "recompute"], "cpu")


def test_setup_objects_render_as_readable_tables():
    from barter_mini.book.efficiency import BENCH_PROFILES
    from barter_mini.book.finetuning import PAPER_TRANSFER
    from barter_mini.book.profiles import PROFILES
    quick = PROFILES["quick"]._repr_markdown_()
    assert quick.startswith("**Profile `quick`**") and "| train subset | 15,000 |" in quick
    assert "| epochs | the recipe's |" in PROFILES["paper"]._repr_markdown_()
    bench = BENCH_PROFILES["smoke"]._repr_markdown_()
    assert "| paper models | (`cct-mini`, 16) |" in bench and "| all densities executed | no |" in bench
    assert "| pretrain classes | all |" in PAPER_TRANSFER._repr_markdown_()


def test_composed_sentences_never_print_a_rounded_zero_as_a_result():
    """The edge values (zero, equal, below the printed precision): no "0.0x", no "0.000 ms",
    no sign compared on "+0.00" and no "at most 0.00 %"."""
    from barter_mini.book.efficiency import what_this_showed as efficiency_showed
    from barter_mini.book.transfer_counts import what_this_showed as transfer_showed
    free = _multiplier_runs().assign(update_ms_per_step=lambda frame: frame["multiplier"] * 1e-5)
    text = transfer_showed(free)
    assert "under 0.001 ms per training step at 1x and under 0.001 ms at 4x" in text
    assert "0.0x" not in text and "0.000 ms" not in text and "inf" not in text
    equal = _multiplier_runs().assign(update_ms_per_step=0.05)
    assert "0.050 ms per training step at 1x and 0.050 ms at 4x (1.0x)" in transfer_showed(equal)
    ours = pd.DataFrame({"method": ["static", "random_receiver"], "acc_diff": [0.001, -0.4]})
    paper = pd.DataFrame({"method": ["static", "random_receiver"], "acc_diff": [-1.05, 0.0]})
    text = ablation_findings(ours, paper, pd.DataFrame(), seeds=1)
    assert "opposite sign" not in text and "same sign" not in text
    assert text.count("no sign to compare at this rounding") == 2
    comparison = pd.DataFrame([
        {"model": "cct-mini", "execution": "eager", "density": 0.3, "speedup": 1.1, "ideal_speedup": 1.5,
         "efficiency": 0.7, "memory_fraction": 0.8, "update_percent_of_training": 0.0}])
    text = efficiency_showed(comparison, "cpu")
    assert "less than 0.01 % of training time" in text and "0.00 %" not in text


def test_counts_agree_with_their_noun_and_zeros_have_no_sign():
    from barter_mini.book.tables import _float_format, count_noun
    assert [count_noun(n, "head") for n in (0, 1, 1.2, 2)] == ["0 heads", "1 head", "1 head", "2 heads"]
    shown = _float_format(pd.Series([-0.00041, 0.1234, 0.2345]), 3)
    assert shown(-0.00041) == "0.000" and shown(-0.25) == "-0.250"
    moved = pd.DataFrame({"method": ["barter"], "seed": [0], "heads moved": [1], "FFN channels moved": [1]})
    text = ablation_findings(pd.DataFrame({"method": ["static"], "acc_diff": [-0.5]}),
                             pd.DataFrame({"method": ["static"], "acc_diff": [-1.0]}), moved, seeds=1)
    assert "barter 1 head and 1 FFN channel" in text


def test_an_allocation_that_ends_where_it_started_is_not_said_to_have_gone_anywhere():
    from barter_mini.book.walkthrough import _change_words
    assert _change_words("Heads per layer", [3, 3, 3], [3, 3, 3]) == "Heads per layer ended as they started (3 / 3 / 3)"
    assert _change_words("Heads per layer", [3, 3, 3], [2, 3, 4]) == "Heads per layer went from 3 / 3 / 3 to 2 / 3 / 4"


def test_the_introductions_efficiency_sentence_spans_the_densities_and_says_one_value_once():
    from barter_mini.book.efficiency import headline
    rows = [{"model": "cct-paper", "execution": "eager", "density": d, "speedup": s, "efficiency": e,
             "memory_fraction": m} for d, s, e, m in ((0.1, 3.0, 1 / 3, 0.4), (0.5, 1.8, 0.9, 0.4))]
    rows.append({"model": "cct-paper", "execution": "recompute", "density": 0.1, "speedup": 9.0, "efficiency": 1.0,
                 "memory_fraction": 0.1})
    text = headline(pd.DataFrame(rows), "cpu")
    assert text == ("Measured on this machine (cpu): on `cct-paper` BARTER's step ran at 3.00x RigL's speed at "
                    "rho = 0.1 and 1.80x at 0.5 (33 to 90 % of its FLOPs-ideal speedup) and held 40 % of RigL's "
                    "peak memory.")
    assert "at rho = 0.1 (33 %" in headline(pd.DataFrame(rows[:1]), "cpu")
    assert headline(pd.DataFrame(rows[2:]), "cpu") == "No eager BARTER and RigL pair was measured in this build."


def test_the_introductions_finetuning_sentence_names_the_epochs_that_buy_the_gain():
    from barter_mini.book.finetuning import FULL, MATCHED, headline
    rows = []
    for seed in (0, 1, 2):
        for method, acc, pflops in (("rigl", 80 + seed, 2.5), ("barter", 81 + seed, 1.0)):
            rows.append({"method": method, "density": 0.3, "seed": seed, "schedule": FULL, "epochs": 3,
                         "pflops": pflops, "acc": acc})
        rows.append({"method": "barter", "density": 0.3, "seed": seed, "schedule": MATCHED, "epochs": 7.5,
                     "pflops": 2.5, "acc": 84 + seed})
    runs = pd.DataFrame(rows)
    assert headline(runs) == (
        "At rho = 0.3, BARTER fine-tuned for 0.40 of RigL's training compute and ended +1.00 ± 0.00 points (beyond "
        "the seed noise) against RigL; given RigL's compute (7.5 epochs instead of 3, so much of the gain is simply "
        "longer training) it gained +3.00 ± 0.00 points (beyond the seed noise) over its recipe epochs (3 seeds).")
    assert headline(runs[runs["seed"] == 0]).endswith("+3.00 points over its recipe epochs (1 seed).")
    assert headline(runs[runs["schedule"] == FULL]) == "No compute-matched BARTER run was trained in this build."


def test_a_gap_that_rounds_to_zero_prints_without_a_sign():
    from barter_mini.book.findings import _points
    from barter_mini.book.finetuning import _gap
    assert _points(-0.001) == "0.00 points" and _points(0.004) == "0.00 points"
    assert _gap(pd.Series([-0.001])) == "0.00 points"
    assert _points(-0.006) == "-0.01 points" and _points(1.5) == "+1.50 points"


def test_words_are_listed_as_a_sentence_lists_them():
    from barter_mini.book.tables import listed
    assert listed([]) == "" and listed(["a"]) == "a" and listed(("a", "b")) == "a and b"
    assert listed(str(n) for n in range(3)) == "0, 1 and 2"
