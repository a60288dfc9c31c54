"""The replay report says what decode ran: speculative decoding asked for, with most chunks
drafting nothing (the adaptive planner turned speculation off, auto measured target-only as faster), is reported
as target-only in report.json's "decode" and the console table, and an acceptance rate measured on the probes'
few drafts is not shown as the run's."""
from rich.console import Console

from edgeinfer.engines.backends.auto import choice_counters
from edgeinfer.sim.report import engine_choice_section, print_table


def _report(decode: str, with_drafts: int, drafted: int, accepted: int, chunks: int = 400) -> dict:
    """A replay report's headline, decode and spec sections as sim/metrics.summarize writes them."""
    return {"log": "measurement_1", "decode": decode, "engine": "auto fp32 cpu",
            "chunks": {"received": chunks},
            "spec": {"acceptance_rate": accepted / drafted if drafted else None, "tokens_per_target_pass": 1.0,
                     "drafted": drafted, "accepted": accepted, "speculative_chunks": with_drafts}}


def _table(report: dict) -> dict[str, str]:
    console = Console(record=True, width=400)
    table = print_table([report], console)
    return dict(zip(table.columns[0]._cells, table.columns[1]._cells))


class _Stats:
    """The runtime's newest Stats: backend auto chose onnxruntime, target-only the faster decode there (the counters
    as the runtime node publishes them, engines/backends/auto.py choice_counters)."""

    counters = choice_counters({
        "chosen": "onnxruntime", "start_up_s": 0.9, "probes": 24, "excluded": {},
        "candidates": {"onnxruntime": {"chunk_ms_p50": 2.0, "chunk_ms_p90": 2.5, "mismatched_tokens": 0, "k": 0},
                       "fused": {"chunk_ms_p50": 2.2, "chunk_ms_p90": 2.9, "mismatched_tokens": 0, "k": 4}}})


def test_speculation_that_turned_itself_off_is_reported_as_target_only():
    report = _report("speculative", with_drafts=3, drafted=12, accepted=9)  # 0.750, measured on probes alone
    choice = engine_choice_section(report, _Stats())
    assert choice["chosen"] == "onnxruntime" and report["engine"] == "onnxruntime (auto) fp32 cpu"
    assert report["decode"] == ("speculative requested, ran target-only in 397 of 400 chunks (auto: target-only was "
                                "faster on onnxruntime at start-up; adaptive: speculation off; drafts in 3 chunks, "
                                "its probes)")
    assert report["decode_requested"] == "speculative"
    assert report["spec"]["acceptance_from"] == "probes only: 12 drafts in 3 chunks"
    assert report["spec"]["acceptance_rate"] == 0.75  # kept in report.json, with what it is measured on
    rows = _table(report)
    assert rows["decode"] == report["decode"]
    assert rows["acceptance_rate"] == "- (probes only: 12 drafts in 3 chunks)"  # not 0.750
    assert rows["tokens_per_target_pass"] == "1.00"


def test_speculation_that_ran_shows_its_acceptance_with_its_draft_count():
    report = _report("speculative", with_drafts=380, drafted=4096, accepted=3326)
    assert engine_choice_section(report, None) is None  # not backend auto: the decode is described all the same
    assert report["decode"] == "speculative" and "decode_requested" not in report
    assert _table(report)["acceptance_rate"] == "0.812 (4096 drafts in 380 of 400 chunks)"


def test_no_draft_at_all_and_target_only_runs():
    report = _report("speculative", with_drafts=0, drafted=0, accepted=0)
    assert engine_choice_section(report, None) is None  # not backend auto: the decode is described all the same
    assert report["decode"] == ("speculative requested, ran target-only in 400 of 400 chunks (adaptive: speculation "
                                "off)")
    assert _table(report)["acceptance_rate"] == "- (probes only: 0 drafts in 0 chunks)"
    plain = _report("target-only", with_drafts=0, drafted=0, accepted=0)
    engine_choice_section(plain, None)
    assert plain["decode"] == "target-only" and "acceptance_from" not in plain["spec"]
    assert _table(plain)["acceptance_rate"] == "-"
