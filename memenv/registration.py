"""Gymnasium registration of every memenv environment.

``gym.make("memenv:MemQA-v0")`` imports this package (which registers) and then makes the env;
``import memenv; gym.make("MemQA-v0")`` works too. No ``max_episode_steps`` is set: each env enforces its own
turn limit, because the remaining turns are part of what the policy sees.
"""

from __future__ import annotations

from gymnasium.envs.registration import WrapperSpec, register, registry

#: memenv's env checker (:class:`memenv.envs.base.EnvChecker`) in place of Gymnasium's, whose first reset, when it
#: raises (a refused seed), leaves every later step failing.
ENV_CHECKER = WrapperSpec("EnvChecker", "memenv.envs.base:EnvChecker", {})

# id -> (entry point, default kwargs)
ENVIRONMENTS: dict[str, tuple[str, dict]] = {
    "MemQA-v0": ("memenv.envs.memqa:MemQAEnv", {}),
    "MemQA-Hotpot-v0": ("memenv.envs.memqa:MemQAEnv", {"dataset": "hotpotqa", "objectives": 1}),
    # Horizon scaling (MEM1's multi-objective composition): N questions per episode, answered together. The
    # turn limit grows with N (2 * N * hops + 2), so these are the long-horizon variants of MemQA-v0.
    "MemQA-N1-v0": ("memenv.envs.memqa:MemQAEnv", {"objectives": 1}),
    "MemQA-N2-v0": ("memenv.envs.memqa:MemQAEnv", {"objectives": 2}),
    "MemQA-N4-v0": ("memenv.envs.memqa:MemQAEnv", {"objectives": 4}),
    "MemQA-N8-v0": ("memenv.envs.memqa:MemQAEnv", {"objectives": 8}),
    "MemQA-N16-v0": ("memenv.envs.memqa:MemQAEnv", {"objectives": 16}),
    # Long-document reading (MemAgent style): chunks of a document with buried gold paragraphs.
    "MemRead-v0": ("memenv.envs.memread:MemReadEnv", {}),
    # Long conversations (LoCoMo/BEAM style): sessions read one by one, then questions from memory.
    "MemDialog-v0": ("memenv.envs.memdialog:MemDialogEnv", {}),
    "MemDialog-LoCoMo-v0": ("memenv.envs.memdialog:MemDialogEnv", {"dataset": "locomo", "questions": 10}),
    # BEAM (SelfMem): 128K-10M-token chats streamed batch by batch; synthetic, or data_path= BEAM's layout.
    "MemDialog-BEAM-v0": ("memenv.envs.beam:MemDialogBeamEnv", {}),
    # LongMemEval (oracle, S or M file): one item per episode, its sessions streamed; the BEAM env's two memory modes.
    "MemDialog-LongMemEval-v0": ("memenv.envs.beam:MemDialogBeamEnv", {"dataset": "longmemeval"}),
}


def register_envs() -> None:
    """Register every environment of :data:`ENVIRONMENTS` (idempotent)."""
    for env_id, (entry_point, kwargs) in ENVIRONMENTS.items():
        if env_id not in registry:
            register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs), disable_env_checker=True,
                     additional_wrappers=(ENV_CHECKER,))
