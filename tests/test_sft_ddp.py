"""SFT under torchrun: the step's loss is the token mean over every rank, not the mean of the ranks' means.

Two gloo ranks hold batches of very different token counts (length bucketing gives ranks such batches). Each
rank takes :func:`agents.llm.training.sft.sft_loss` of its own batch under DDP; the gradient DDP averages must equal the
gradient of one process's token mean over the union of both batches (action tokens, plus the weighted
observation-token term). The mean of the ranks' own means, what SFT computed before, is measurably another
gradient here, so the test can tell the two apart."""

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_common import run_two_ranks_and_reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent('''
    import os, sys
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    from llm_common import memqa_tokenizer, tiny_model
    from agents.llm.training.sft import sft_loss
    from agents.llm.training.common import ActorCritic, Dist, collate, init_distributed

    OUT, WEIGHT = {out!r}, 0.5
    BATCHES = {{0: [([3, 4, 5], [6, 7]), ([8, 9, 10, 11], [12])],  # 3 action tokens
               1: [(list(range(20, 60)), list(range(60, 100))), (list(range(100, 130)), list(range(130, 170)))]}}

    def forward(model, rank):
        batch = collate(BATCHES[rank], 0, include_prompt=True)
        logp_all, _, _ = model(**batch.inputs())
        return logp_all, batch.prompt

    dist = init_distributed()
    tok = memqa_tokenizer()
    model = ActorCritic(tiny_model(tok, seed=3))
    if dist.enabled:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        total, _ = sft_loss(*forward(ddp, dist.rank), WEIGHT, dist)
        total.backward()
        if dist.main:
            torch.save({{k: p.grad for k, p in model.named_parameters()}}, os.path.join(OUT, "ddp.pt"))
        dist.barrier()
    else:
        def grads(loss):
            model.zero_grad(set_to_none=True)
            loss.backward()
            return {{k: p.grad.clone() for k, p in model.named_parameters()}}

        parts = [forward(model, r) for r in (0, 1)]
        act = sum(-lp[~pr].sum() for lp, pr in parts) / sum(int((~pr).sum()) for _, pr in parts)
        obs = sum(-lp[pr].sum() for lp, pr in parts) / sum(int(pr.sum()) for _, pr in parts)
        union = grads(act + WEIGHT * obs)
        per_rank = [grads(sft_loss(*forward(model, r), WEIGHT, Dist())[0]) for r in (0, 1)]
        lp, pr = forward(model, 1)  # one process: sft_loss is the plain token mean
        total, loss = sft_loss(lp, pr, WEIGHT, Dist())
        assert torch.allclose(loss, -lp[~pr].mean()) and torch.allclose(total, loss - WEIGHT * lp[pr].mean())
        torch.save({{"union": union, "mean_of_means": {{k: (per_rank[0][k] + per_rank[1][k]) / 2 for k in union}}}},
                   os.path.join(OUT, "ref.pt"))
''')


@pytest.mark.slow  # torchrun, 2 ranks: ~30 s loaded
def test_two_gloo_ranks_take_the_token_mean_over_both_ranks(tmp_path):
    ddp_dir, ref_dir = tmp_path / "ddp", tmp_path / "ref"
    for folder in (ddp_dir, ref_dir):  # each run in its own folder, writing its file to tmp_path
        folder.mkdir()
        (folder / "worker.py").write_text(WORKER.format(tests=str(ROOT / "tests"), out=str(tmp_path)))
    run_two_ranks_and_reference(ddp_dir / "worker.py", ref_dir / "worker.py")
    ddp = torch.load(tmp_path / "ddp.pt")
    ref = torch.load(tmp_path / "ref.pt")
    worst = max(float((ddp[k] - ref["union"][k]).abs().max()) for k in ddp)
    scale = max(float(ref["union"][k].abs().max()) for k in ddp)
    other = max(float((ref["mean_of_means"][k] - ref["union"][k]).abs().max()) for k in ddp)
    assert worst <= 1e-5 * max(1.0, scale), (worst, scale)  # fp32 sums in another order
    assert other > 100 * max(worst, 1e-7), (other, worst)  # the per-rank mean is another gradient
