"""Every RL trainer under torchrun: 2 gloo ranks on CPU make the same update as one process on the same global batch.

One torchrun launch (2 ranks) and one plain process (the reference) run the same worker script side by side:
GRPO with every group of rank 0 flat (a constant reward: its minibatches have no loss token), PPO, and MemOPD
(GRPO + the distillation term, a teacher loaded from a path on every rank, gradient accumulation over packed
batches, one update then ``resume`` for the second). The worker replaces the rollout by the real rollout on fixed
per-rank task seeds with a generator reseeded per (update, rank), and a reward made from the group position (so
the groups of rank 1 always differ), so that the reference can play both ranks' episodes itself: its batch is the
union of the two ranks'. Everything is bounded in time (no hang can stall the suite)."""

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent('''
    import dataclasses, os, sys
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    from llm_common import memqa_tokenizer, tiny_model
    import agents.llm.training.ppo as ppo
    from agents.llm.records.rollouts import rollout as real_rollout
    from distill.trainer import MemOPDConfig, train_memopd

    OUT = {out!r}
    WORLD, RANK = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    VIRTUAL = 2  # the ranks the reference plays itself
    PER_RANK = 4

    def set_reward(ep, value):
        for rec in ep.records:
            rec.reward, rec.return_to_go, rec.episode_return = 0.0, value, value
        ep.records[-1].reward = value

    def fake_rollout(cfg):
        rank_cfg = dataclasses.replace(cfg, episodes_per_update=PER_RANK)
        def run(policy, envs, seeds, groups=None, gamma=1.0):
            update = next(u for u in range(100) if ppo.task_seeds(cfg, u, RANK)[0] == list(seeds))
            episodes = []
            for r in ([RANK] if WORLD > 1 else range(VIRTUAL)):
                s, g = ppo.task_seeds(rank_cfg, update, r)
                policy.generator.manual_seed(1000 * update + r)
                eps = real_rollout(policy, envs, s, groups=[None if x is None else x + 100 * r for x in g], gamma=gamma)
                for k, ep in enumerate(eps):
                    flat = cfg.algo == "grpo" and r == 0  # rank 0: every group flat (no loss token)
                    set_reward(ep, 0.5 if flat else 0.25 * (k % cfg.group_size) + 0.1 * len(ep.records))
                episodes += eps
            return episodes
        return run

    real_save = ppo._save
    def spy_save(cfg, dist, out, update, lm, *rest):
        with open(os.path.join(out, f"sum.{{update}}.rank{{dist.rank}}"), "w") as fh:
            fh.write(ppo.param_checksum(lm))
        real_save(cfg, dist, out, update, lm, *rest)
    ppo._save = spy_save

    tok = memqa_tokenizer()
    common = dict(updates=1, episodes_per_update=PER_RANK * (1 if WORLD > 1 else VIRTUAL), group_size=2,
                  num_minibatches=1, epochs=2, lr=1e-3, max_new_tokens=8, num_envs=2, eval_every=0, save_every=1,
                  progress=False, threads=1, env_kwargs={{"objectives": 1, "hops": 1, "max_turns": 2}})
    for name, kw in (("grpo", dict(algo="grpo")), ("ppo", dict(algo="ppo")),
                     ("memopd", dict(algo="grpo", updates=2, epochs=1, distill_coef=1.0, chunk=16, token_budget=128,
                                     grad_accumulation=True))):
        base = dict(out_dir=os.path.join(OUT, name), teacher=os.path.join(OUT, "teacher"), distill_coef=0.0,
                    grad_accumulation=False)
        cfg = MemOPDConfig(**{{**base, **common, **kw}})
        ppo.rollout = fake_rollout(cfg)
        model = tiny_model(tok, seed=1)
        if name != "memopd":
            ppo.train_rl(cfg, model=model, tokenizer=tok)
        elif WORLD == 1:
            train_memopd(cfg, model=model, tokenizer=tok)
        else:  # one update, then resume for the second (every rank loads the checkpoint and the teacher)
            train_memopd(dataclasses.replace(cfg, updates=1), model=model, tokenizer=tok)
            train_memopd(dataclasses.replace(cfg, resume=True))
''')


UPDATES = {"grpo": 1, "ppo": 1, "memopd": 2}  # GRPO, PPO: one update of 2 epochs; MemOPD: 2 updates (a resume)


def _weights(folder, updates):
    from safetensors.torch import load_file

    return load_file(str(folder / f"checkpoint-{updates:07d}" / "model.safetensors"))


@pytest.mark.slow  # torchrun, 2 ranks per trainer: ~70 s loaded
def test_two_gloo_ranks_equal_one_process_on_the_global_batch(tmp_path):
    from llm_common import memqa_tokenizer, run_two_ranks_and_reference, tiny_model

    from agents.llm.models.local import save_pretrained

    tok = memqa_tokenizer()
    ddp, ref = tmp_path / "ddp", tmp_path / "ref"
    for folder in (ddp, ref):
        folder.mkdir()
        save_pretrained(tiny_model(tok, seed=2, initializer_range=0.3), tok, folder / "teacher")
        (folder / "worker.py").write_text(WORKER.format(tests=str(ROOT / "tests"), out=str(folder)))
    run_two_ranks_and_reference(ddp / "worker.py", ref / "worker.py")
    start = tiny_model(tok, seed=1).state_dict()
    for name in ("grpo", "ppo", "memopd"):
        for update in range(1, UPDATES[name] + 1):  # the ranks agree after every update (also after the resume)
            sums = {(ddp / name / f"sum.{update}.rank{r}").read_text() for r in (0, 1)}
            assert len(sums) == 1, (name, update)
        a, b = _weights(ddp / name, UPDATES[name]), _weights(ref / name, UPDATES[name])
        moved = max(float((a[k] - start[k]).abs().max()) for k in a)
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
        assert moved > 1e-3, (name, moved)  # the updates did something
        assert diff <= 1e-5, (name, diff, moved)  # and it is the one-process update on the global batch
    rows = (ddp / "grpo" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    flat = [float(r.split(",")[header.index("zero_variance_groups")]) for r in rows[1:]]
    assert flat == [1.0]  # rank 0's 2 groups flat, rank 1's none: mean over ranks 1 (logged by rank 0)
