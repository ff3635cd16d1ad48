"""The experiment's actor timing: a warm-up pass per layout, the layout order rotated each round, the arms'
thread count, and every layout's ratio to both the naive and the best padded baseline."""

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from distill.experiment import stages  # noqa: E402
from distill.experiment.config import ExperimentConfig  # noqa: E402
from distill.experiment.stages import actor_timing  # noqa: E402
from distill.trainer import PackedActorForward  # noqa: E402

# fake CPU seconds per pass: sorted padded with sdpa_blocks is the fastest padded layout
COST = {("padded", "auto"): 10.0, ("padded", "sdpa_blocks"): 9.0, ("sorted_padded", "auto"): 8.0,
        ("sorted_padded", "sdpa_blocks"): 6.0, ("shared_prefix", "auto"): 5.0, ("shared_prefix", "sdpa_blocks"): 4.0,
        ("prefix_tree", "sdpa_blocks"): 2.0}


def test_actor_timing_warms_up_rotates_and_compares_with_the_best_padded_baseline(tmp_path, monkeypatch):
    from agents.llm.models.local import make_tiny

    env_kwargs = {"objectives": 1, "hops": 1, "comparison_rate": 0.0, "max_turns": 2}
    make_tiny(tmp_path / "student", env_kwargs=env_kwargs, episodes=4, vocab_size=300, include_corpus=False,
              hidden_size=16, layers=1, heads=2)
    cfg = ExperimentConfig(out=str(tmp_path / "exp"), env_kwargs=env_kwargs, tasks_per_update=1, group_size=2,
                           max_new_tokens=6, num_envs=2, threads=1, timing_rounds=3, progress=False)
    (tmp_path / "exp").mkdir()
    clock = [0.0]
    calls = []
    real_call = PackedActorForward.__call__

    def fake_call(self, module, records, **kw):
        key = (self.layout.packing, self.layout.backend)
        calls.append((self.layout.reconstruction, key, torch.get_num_threads()))
        clock[0] += COST[key]
        return real_call(self, module, records, **kw)

    monkeypatch.setattr(PackedActorForward, "__call__", fake_call)
    monkeypatch.setattr(stages.time, "process_time", lambda: clock[0])
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(2)  # what the SFT stages leave behind on a 2-core machine
    try:
        table = actor_timing(cfg, {"path": str(tmp_path / "student")})
        assert torch.get_num_threads() == 2  # restored afterwards
    finally:
        torch.set_num_threads(torch_threads)
    assert {threads for _, _, threads in calls} == {1}  # every pass at the arms' thread count
    layouts = list(COST)
    for reconstruction in ("aligned", "persistent"):
        order = [key for rec, key, _ in calls if rec == reconstruction]
        assert len(order) == 4 * len(layouts)  # a warm-up round, then 3 timed rounds
        rounds = [order[i * len(layouts):(i + 1) * len(layouts)] for i in range(4)]
        assert rounds[0] == layouts and all(sorted(r) == sorted(layouts) for r in rounds)
        assert [r[0] for r in rounds] == layouts[:4]  # rotated by one each round: a new layout first
    rows = table[table.reconstruction == "aligned"].set_index(["packing", "backend"])
    assert list(rows.index) == layouts
    # the fake clock counts only the forward; the backward adds nothing to it
    for key, cost in COST.items():
        assert rows.loc[key, "actor_cpu_s"] == pytest.approx(cost)
        assert rows.loc[key, "x_vs_naive_padded"] == pytest.approx(10.0 / cost)
        assert rows.loc[key, "x_vs_best_padded"] == pytest.approx(6.0 / cost)
    assert set(table.best_padded) == {"sorted_padded sdpa_blocks"} and set(table.threads) == {1}
    assert (table.rounds == 3).all()
    saved = pd.read_csv(tmp_path / "exp" / "timing.csv")
    assert saved.shape == table.shape
