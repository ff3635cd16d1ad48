"""Generation: a model as a memenv policy, sampling token-exact.

:class:`~agents.llm.generation.policy.LLMPolicy` (:mod:`~agents.llm.generation.policy`) encodes observations,
samples a batch of actions and keeps per invocation the prompt ids, the sampled ids and their log-probs; the
padding-free prefix-tree decoding it runs on (:mod:`~agents.llm.generation.tree_generation`) and the lean and
compiled decode steps of that path (:mod:`~agents.llm.generation.lean_decode`,
:mod:`~agents.llm.generation.compiled_decode`), whose LM head reads its weight reordered once per batch
(:mod:`~agents.llm.generation.packed_head`). Built on :mod:`agents.llm.models` only; running whole episodes
and turning them into records is :mod:`agents.llm.records`' job.
"""
