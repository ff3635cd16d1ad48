"""The invocation record and everything that reads or writes it.

The :class:`~agents.llm.records.invocation.InvocationRecord` with its JSON-lines save/load
(:mod:`~agents.llm.records.invocation`); rollouts, which run a policy's episodes over envs and join them with the
env snapshots into records (:mod:`~agents.llm.records.rollouts`); the transcript views that render an episode as
one text (:mod:`~agents.llm.records.transcript`); the exporters to other RL stacks' rows
(:mod:`~agents.llm.records.exchange`); the self-contained HTML viewer of records and bench traces
(:mod:`~agents.llm.records.viewer`, ``memenv view``); and ``memenv records`` (:mod:`~agents.llm.records.cli`).
Built on :mod:`agents.llm.models` and :mod:`agents.llm.generation`; the trainers and adapters build on it.
"""
