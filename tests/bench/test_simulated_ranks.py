"""bench.simulated_ranks keeps the runs it finished when a later one fails: one line naming the
failed run and where the finished ones are (the launches replaced by a stand-in here; the
simulation's numerics are tests/train/test_simulate.py's)."""

from __future__ import annotations

import csv

from fp4quant.bench import simulated_ranks


def test_a_failed_run_keeps_the_finished_ones_and_says_where(tmp_path, monkeypatch, capsys):
    launched = []

    def launch(kind, world, train_args, out):
        launched.append((kind, world))
        if len(launched) == 3:
            raise RuntimeError(f"{kind} run at W = {world} failed (137): ['Killed']")
        return {"tokens_per_s": 100.0 * len(launched), "step_time_s": 0.1, "final_loss": 2.0}, 1.0

    monkeypatch.setattr(simulated_ranks, "launch", launch)
    out = tmp_path / "sim.csv"
    assert simulated_ranks.main(["--worlds", "2", "--repeats", "1", "--steps", "10", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "failed (137)" in err and "the 2 runs finished are in" in err and "sim.csv.partial.csv" in err, err
    kept = list(csv.DictReader(open(f"{out}.partial.csv")))
    assert [(r["kind"], r["world"]) for r in kept] == [(k, str(w)) for k, w in launched[:2]]
    assert not out.exists()

    launched.clear()
    monkeypatch.setattr(simulated_ranks, "launch", lambda kind, world, args, o: (
        {"tokens_per_s": 100.0, "step_time_s": 0.1, "final_loss": 2.0}, 1.0))
    assert simulated_ranks.main(["--worlds", "2", "--repeats", "1", "--steps", "10", "--out", str(out)]) == 0
    assert out.exists() and not (tmp_path / "sim.csv.partial.csv").exists()
