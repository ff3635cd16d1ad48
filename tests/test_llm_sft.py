"""SFT batching and schedules: length buckets, the budget-driven cosine, bf16 autocast, config validation."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agents.llm.training.sft import SFTConfig, length_buckets, lr_at, train_sft  # noqa: E402


def test_length_buckets_cut_padding_and_keep_uniform_draws():
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 700, size=500)
    batches = length_buckets(lengths, batch_size=16, bucket=8, rng=np.random.default_rng(1))
    drawn = [next(batches) for _ in range(800)]
    assert all(len(b) == 16 for b in drawn)

    def waste(batch_list):  # padded cells / real cells, as collate pads to the longest row
        return sum(16 * lengths[b].max() - lengths[b].sum() for b in batch_list) / sum(lengths[b].sum() for b in batch_list)

    plain = [next(length_buckets(lengths, 16, 1, np.random.default_rng(i))) for i in range(800)]
    assert waste(drawn) < 0.1 < 0.5 < waste(plain)  # uniform batches pad ~60% here; buckets a few percent
    counts = np.bincount(np.concatenate(drawn), minlength=len(lengths))
    assert counts.min() > 0  # every sequence is drawn, and about equally often (uniform draws)
    assert counts.std() / counts.mean() < 0.25


def test_lr_follows_the_budget_clock_when_asked():
    cfg = SFTConfig(lr=1e-3, warmup=10, steps=10_000, min_lr_ratio=0.1, max_seconds=100.0, schedule_by="budget")
    assert lr_at(0, cfg, 0.0) == pytest.approx(1e-4)  # warm-up is in steps
    assert lr_at(20, cfg, 0.0) == pytest.approx(1e-3)
    assert lr_at(20, cfg, 50.0) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert lr_at(20, cfg, 100.0) == pytest.approx(1e-4)
    assert lr_at(20, cfg, 500.0) == pytest.approx(1e-4)  # past the budget: stays at the floor
    by_steps = SFTConfig(lr=1e-3, warmup=10, steps=110, min_lr_ratio=0.1, max_seconds=100.0)
    assert lr_at(60, by_steps, 99.0) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))))


@pytest.mark.parametrize("field,value", [("autocast", "fp8"), ("schedule_by", "epochs"), ("bucket", 0)])
def test_bad_sft_options_are_named(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        train_sft(SFTConfig(out_dir=str(tmp_path), **{field: value}))


def test_sft_with_bf16_autocast_and_budget_schedule_learns(tmp_path):
    cfg = SFTConfig(out_dir=str(tmp_path), env_kwargs={"objectives": 1, "hops": 1, "max_turns": 3}, episodes=8,
                    steps=40, batch_size=4, lr=1e-2, warmup=2, eval_every=1000, save_every=1000, eval_episodes=2,
                    num_envs=2, max_new_tokens=8, threads=1, progress=False, autocast="bf16", bucket=4,
                    tiny_vocab=300, tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_tokenizer_episodes=8)
    train_sft(cfg)
    import csv

    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    losses = [float(r["loss"]) for r in rows if r.get("loss")]
    assert losses[-1] < 0.8 * losses[0]  # the bf16 forward still trains the fp32 weights


def test_a_time_budgeted_sft_bar_shows_the_budget_not_the_step_cap(tmp_path, capsys):
    cfg = SFTConfig(out_dir=str(tmp_path), env_kwargs={"objectives": 1, "hops": 1, "max_turns": 3}, episodes=4,
                    steps=100_000, max_seconds=1.0, budget_clock="cpu", batch_size=2, warmup=1, eval_every=0,
                    save_every=0, num_envs=2, max_new_tokens=8, threads=1, progress=True, tiny_vocab=300,
                    tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_tokenizer_episodes=4)
    row = train_sft(cfg)
    err = capsys.readouterr().err
    assert row["step"] < 100_000  # the budget ended the run
    assert "cpu-s" in err and "/100000" not in err  # its bar counts CPU-seconds of a 1-second budget
    assert "1/1 [" in err  # and was full at the end


class _Clocks:
    """A wall and a CPU clock that move only when told: the timer's arithmetic, free of the machine's load."""

    def __init__(self) -> None:
        self.now_wall, self.now_cpu = 100.0, 7.0

    def wall(self) -> float:
        return self.now_wall

    def cpu(self) -> float:
        return self.now_cpu

    def spend(self, wall: float, cpu: float) -> None:
        self.now_wall += wall
        self.now_cpu += cpu


def test_timer_leaves_excluded_blocks_off_both_clocks():
    from agents.llm.training.common import Timer

    clocks = _Clocks()
    timer = Timer(wall_clock=clocks.wall, cpu_clock=clocks.cpu)
    clocks.spend(wall=0.5, cpu=0.25)
    with timer.excluded():
        clocks.spend(wall=3.0, cpu=2.0)
        assert timer() == 0.5 + 3.0  # inside the block it still runs; it is taken off when the block ends
    with timer.excluded(enabled=False):  # counted as usual
        clocks.spend(wall=0.75, cpu=0.5)
    assert timer() == 0.5 + 0.75 and timer.cpu() == 0.25 + 0.5  # the excluded block is on neither clock
    assert (timer.excluded_wall, timer.excluded_cpu) == (3.0, 2.0)
    assert timer.budget("wall") == timer() and timer.budget("cpu") == timer.cpu()
    with pytest.raises(ValueError, match="budget clock must be 'wall' or 'cpu', got 'gpu'"):
        timer.budget("gpu")
    with pytest.raises(RuntimeError), timer.excluded():  # an evaluation that fails is excluded too
        clocks.spend(wall=1.0, cpu=1.0)
        raise RuntimeError
    assert timer() == 1.25 and timer.excluded_wall == 4.0


def test_timer_resumes_from_the_elapsed_seconds_of_a_saved_run():
    from agents.llm.training.common import Timer

    clocks = _Clocks()
    timer = Timer((60.0, 45.0), wall_clock=clocks.wall, cpu_clock=clocks.cpu)
    clocks.spend(wall=2.0, cpu=1.0)
    assert (timer(), timer.cpu()) == (62.0, 46.0)


def test_sft_evaluations_do_not_count_on_the_budget(tmp_path):
    import csv

    cfg = SFTConfig(out_dir=str(tmp_path), env_kwargs={"objectives": 1, "hops": 1, "max_turns": 3}, episodes=4,
                    steps=9, batch_size=2, warmup=1, eval_every=3, save_every=1000, eval_episodes=4, num_envs=2,
                    max_new_tokens=16, threads=1, progress=False, tiny_vocab=300, tiny_hidden=32, tiny_layers=1,
                    tiny_heads=2, tiny_tokenizer_episodes=4)
    train_sft(cfg)
    rows = [r for r in csv.DictReader(open(tmp_path / "metrics.csv")) if r.get("eval_f1")]
    assert [int(r["step"]) for r in rows] == [3, 6, 9]
    first, second = (float(rows[0]["eval_cpu_seconds"]), float(rows[1]["eval_cpu_seconds"]))
    assert 0 < first < second  # cumulative evaluation CPU time, logged beside the training clock
    # the training clock between the first two evaluations holds 3 small steps, not the evaluation that came first
    # (the last row's also holds the final checkpoint's save: a first save imports transformers' writer, ~1-2 CPU-s)
    assert float(rows[1]["cpu_seconds"]) - float(rows[0]["cpu_seconds"]) < first + 1.0


def test_sft_zero_intervals_mean_never_evaluate_and_save_only_at_the_end(tmp_path):
    import csv

    cfg = SFTConfig(out_dir=str(tmp_path), env_kwargs={"objectives": 1, "hops": 1, "max_turns": 3}, episodes=4,
                    steps=3, batch_size=2, warmup=1, eval_every=0, save_every=0, log_every=0, num_envs=2,
                    max_new_tokens=16, threads=1, progress=False, tiny_vocab=300, tiny_hidden=32, tiny_layers=1,
                    tiny_heads=2, tiny_tokenizer_episodes=4)
    train_sft(cfg)  # eval_every=0 used to divide by zero
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [3]  # logged once, at the end
    assert not any(r.get("eval_f1") for r in rows)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-0000003"]


def test_demo_worlds_play_each_demonstration_in_another_world_never_the_configured_one(tmp_path):
    from agents.llm.models.local import make_tiny
    from agents.llm.generation.policy import LLMPolicy
    from agents.llm.training.sft import demo_env_kwargs, expert_data

    env_kwargs = {"objectives": 1, "hops": 1, "comparison_rate": 0.0, "max_turns": 3, "world_seed": 4}
    lm, tok = make_tiny(None, env_kwargs=env_kwargs, episodes=4, vocab_size=300, include_corpus=False,
                        hidden_size=16, layers=1, heads=2)
    policy = LLMPolicy(lm, tok)
    cfg = SFTConfig(env_kwargs=env_kwargs, demo_worlds=2)
    assert [demo_env_kwargs(cfg, i)["world_seed"] for i in range(4)] == [5, 6, 5, 6]
    assert demo_env_kwargs(SFTConfig(env_kwargs=env_kwargs), 3) == env_kwargs

    def first_prompts(data):  # the prompt of each episode's first invocation (it holds the questions)
        return [tok.decode(d.prompt_ids) for d in data if "No search results yet" in tok.decode(d.prompt_ids)]

    spread = first_prompts(expert_data(policy, cfg, [0, 1, 2, 3]))
    # Grouped by world (5: seeds 0 and 2, then 6: seeds 1 and 3), each equal to that world's own episode.
    by_hand = []
    for world, seeds in ((5, [0, 2]), (6, [1, 3])):
        one = SFTConfig(env_kwargs={**env_kwargs, "world_seed": world})
        by_hand += first_prompts(expert_data(policy, one, seeds))
    assert spread == by_hand
    configured = first_prompts(expert_data(policy, SFTConfig(env_kwargs=env_kwargs), [0, 1, 2, 3]))
    assert not set(spread) & set(configured)
    with pytest.raises(ValueError, match="demo_worlds"):
        SFTConfig(demo_worlds=-1)
    with pytest.raises(ValueError, match="demo_worlds=2 needs an env with a synthetic world"):
        expert_data(policy, SFTConfig(env_id="MemDialog-v0", env_kwargs={}, demo_worlds=2), [0])


@pytest.mark.parametrize("autocast", ["none", "bf16"])  # bf16: the README's SmolLM2 SFT on a native-bf16 CPU
def test_sft_with_activation_checkpointing_makes_the_same_steps(tmp_path, monkeypatch, autocast):
    import csv

    import agents.llm.training.sft as sft
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.common import latest_checkpoint

    enabled = []
    real = sft.enable_activation_checkpointing
    monkeypatch.setattr(sft, "enable_activation_checkpointing", lambda lm: (enabled.append(lm), real(lm)))
    runs = {}
    for on in (False, True):
        out = tmp_path / f"gc{int(on)}"
        cfg = SFTConfig(out_dir=str(out), env_kwargs={"objectives": 1, "hops": 1, "max_turns": 3}, episodes=4,
                        steps=3, batch_size=4, warmup=1, lr=3e-3, eval_every=0, save_every=0, log_every=1,
                        num_envs=2, max_new_tokens=16, threads=1, progress=False, tiny_vocab=300, tiny_hidden=32,
                        tiny_layers=2, tiny_heads=2, tiny_tokenizer_episodes=4, autocast=autocast,
                        gradient_checkpointing=on)
        train_sft(cfg)
        rows = list(csv.DictReader(open(out / "metrics.csv")))
        runs[on] = ([float(r["loss"]) for r in rows], load_pretrained(latest_checkpoint(out))[0].state_dict())
    flag = "is_activation_checkpointing" if hasattr(enabled[0], "is_activation_checkpointing") else \
        "is_gradient_checkpointing"  # transformers >= 5 / earlier
    assert len(enabled) == 1 and getattr(enabled[0], flag)  # only the run that asked for it
    assert runs[True][0] == pytest.approx(runs[False][0], abs=1e-5)  # recomputed activations: the same steps
    worst = max(float((runs[True][1][k] - runs[False][1][k]).abs().max()) for k in runs[False][1])
    assert worst <= 1e-5
    assert runs[False][0][-1] < runs[False][0][0]  # and the steps did train


def test_an_evaluation_pause_is_left_out_of_the_training_bars_eta():
    """The SFT/PPO bar's rate and ETA count training only: the time inside ``off_the_bar`` (an evaluation, a
    checkpoint) moves the bar's start and last-print times on by the pause (a fake clock: no timed test)."""
    import io

    from tqdm import tqdm

    from agents.llm.training import common as training

    bar = tqdm(total=10, file=io.StringIO(), mininterval=0)
    clock = iter([1000.0, 1060.0] + [1060.0] * 10)  # the pause: 60 s (then close reads it)
    bar._time = lambda: next(clock)
    bar.start_t, bar.last_print_t = 900.0, 990.0
    with training.off_the_bar(bar):
        pass
    assert (bar.start_t, bar.last_print_t) == (960.0, 1050.0)
    bar.close()
    with training.off_the_bar(tqdm(total=1, disable=True)):  # a disabled bar has no clock: nothing to move
        pass


def test_sft_batches_pad_to_a_multiple_and_the_loss_does_not_change():
    """SFT pads each batch's width up to ``pad_multiple`` (few distinct shapes for the CPU kernels' per-shape
    caches), never past the model's positions and never below the longest row; the action log-probs are those
    of the unpadded batch (right padding is masked)."""
    from llm_common import memqa_tokenizer, tiny_model

    from agents.llm.training.common import ActorCritic, collate, release_free_memory

    rows = [([5, 6, 7, 8, 9], [10, 11]), ([5, 6, 7], [12, 13, 14])]
    assert collate(rows, 0).input_ids.shape[1] == 7
    assert collate(rows, 0, pad_multiple=64).input_ids.shape[1] == 64
    assert collate(rows, 0, pad_multiple=64, max_width=32).input_ids.shape[1] == 32
    assert collate(rows, 0, pad_multiple=64, max_width=4).input_ids.shape[1] == 7  # the longest row stays whole
    model = ActorCritic(tiny_model(memqa_tokenizer()))
    plain = model(**collate(rows, 0, include_prompt=True).inputs())[0]
    padded = model(**collate(rows, 0, include_prompt=True, pad_multiple=64).inputs())[0]
    assert torch.allclose(plain, padded, atol=1e-5)
    assert SFTConfig().pad_multiple == 64
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="pad_multiple"):
            SFTConfig(pad_multiple=bad)
    assert release_free_memory() in (True, False)  # glibc's malloc_trim where there is one; never raises


def _lm_head_rows(tmp_path, monkeypatch, pad_multiple: int) -> tuple[list[int], float]:
    """The row counts the LM head saw in 4 SFT steps (no evaluation) and the last logged loss."""
    import csv

    import agents.llm.training.sft as sft

    seen: list[int] = []
    step = sft.sft_step

    def watched(cfg, run, batch, i):
        if i == 0:
            run.lm.get_output_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
        logp, grad_norm = step(cfg, run, batch, i)
        assert len(logp) == int((~batch.prompt).sum())  # the dummy targets never reach the loss or the logs
        return logp, grad_norm

    monkeypatch.setattr(sft, "sft_step", watched)
    cfg = SFTConfig(out_dir=str(tmp_path / str(pad_multiple)), env_kwargs={"objectives": 1, "hops": 1, "max_turns": 3},
                    episodes=4, steps=4, batch_size=3, bucket=1, warmup=1, eval_every=0, save_every=0, log_every=1,
                    num_envs=2, max_new_tokens=16, threads=1, progress=False, autocast="none", tiny_vocab=300,
                    tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_tokenizer_episodes=4, pad_multiple=pad_multiple)
    train_sft(cfg)
    rows = list(csv.DictReader(open(tmp_path / str(pad_multiple) / "metrics.csv")))
    return seen, float(rows[-1]["loss"])


def test_sft_pads_the_target_count_so_the_lm_head_sees_few_shapes(tmp_path, monkeypatch):
    """Issue 51: the number of action tokens changes every step, and each new count of the LM head's bf16 products
    cost a few MB of oneDNN plan and fragmented heap that stayed: the tiny SFT run grew to 8 GB. SFT pads the
    target count to ``pad_multiple`` (dummy targets, sliced off before the loss): the head sees multiples only, and
    the loss is the unpadded one."""
    from agents.llm.training.common import collate

    batch = collate([([5, 6, 7], [8, 9]), ([5, 6], [10])], 0)
    padded = batch.inputs(64)
    assert [len(padded[k]) for k in ("rows", "cols", "targets")] == [64, 64, 64]
    assert padded["targets"][:3].tolist() == batch.targets.tolist() and not padded["targets"][3:].any()
    assert len(batch.inputs()["targets"]) == 3
    seen, loss = _lm_head_rows(tmp_path, monkeypatch, 64)
    assert len(seen) == 4 and all(n % 64 == 0 for n in seen)
    seen_plain, loss_plain = _lm_head_rows(tmp_path, monkeypatch, 1)
    assert any(n % 64 for n in seen_plain)  # unpadded, the counts are whatever the batch holds
    assert loss == pytest.approx(loss_plain, rel=1e-4)


def test_sft_frees_the_gradients_after_each_step_and_makes_the_same_steps(tmp_path, monkeypatch):
    """The gradients are freed right after the optimizer step (not held beside the next forward, a checkpoint
    write or an evaluation: 538 MB on SmolLM2): the same losses and weights as a run that keeps them."""
    import csv

    import agents.llm.training.sft as sft
    from agents.llm.models.local import load_pretrained
    from agents.llm.training.common import latest_checkpoint

    setup = sft.sft_setup
    runs = {}
    for keep in (False, True):
        seen = []

        def traced_setup(cfg, data, keep=keep, seen=seen):
            run = setup(cfg, data)
            if keep:  # as before: the zero_grad right after a step is skipped, the one before backward stays
                skip, zero = [False], run.optimizer.zero_grad
                run.optimizer.register_step_post_hook(lambda *a: skip.__setitem__(0, True))
                run.optimizer.zero_grad = lambda set_to_none=True: skip.__setitem__(0, False) if skip[0] else \
                    zero(set_to_none=set_to_none)
            seen.append(run)
            return run

        monkeypatch.setattr(sft, "sft_setup", traced_setup)
        out = tmp_path / f"keep{int(keep)}"
        cfg = SFTConfig(out_dir=str(out), env_kwargs={"objectives": 1, "hops": 1, "max_turns": 3}, episodes=4,
                        steps=3, batch_size=4, warmup=1, lr=3e-3, eval_every=0, save_every=0, log_every=1,
                        num_envs=2, max_new_tokens=16, threads=1, progress=False, tiny_vocab=300, tiny_hidden=32,
                        tiny_layers=2, tiny_heads=2, tiny_tokenizer_episodes=4, autocast="none")
        train_sft(cfg)
        held = [p.grad is not None for p in seen[0].model.parameters()]
        rows = list(csv.DictReader(open(out / "metrics.csv")))
        runs[keep] = ([float(r["loss"]) for r in rows], load_pretrained(latest_checkpoint(out))[0].state_dict(), held)
    assert not any(runs[False][2]) and all(runs[True][2])  # freed after the last step / held without the change
    assert runs[False][0] == runs[True][0]
    assert all(torch.equal(runs[False][1][k], runs[True][1][k]) for k in runs[False][1])
