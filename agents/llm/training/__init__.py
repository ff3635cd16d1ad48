"""Training: the trainers of ``memenv train`` and what they share.

Behaviour cloning of the oracle (:mod:`~agents.llm.training.sft`, with the tiny-model recipe in
:mod:`~agents.llm.training.recipes`, and DAgger-style demonstrations, an expert's labels on another policy's states,
in :mod:`~agents.llm.training.relabel`); PPO and GRPO (:mod:`~agents.llm.training.ppo`, a loop of named steps, with
the actor forward and the loss hook in :mod:`~agents.llm.training.actor`, the advantages in
:mod:`~agents.llm.training.advantages` and the update in :mod:`~agents.llm.training.ppo_update`); low-rank
adapters (:mod:`~agents.llm.training.lora`); what every trainer shares, the run config, torchrun, batching,
checkpoints and metrics (:mod:`~agents.llm.training.common`); and the ``memenv train`` command
(:mod:`~agents.llm.training.cli`). Built on :mod:`agents.llm.models`, :mod:`agents.llm.generation` and
:mod:`agents.llm.records`; ``distill`` builds on it.
"""
