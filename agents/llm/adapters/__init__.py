"""Adapters: the LLM stack in other stacks' loops, and other stacks' models in ours.

TRL's ``GRPOTrainer(rollout_func=...)`` (:mod:`~agents.llm.adapters.trl`) and TRL's environment tools
(:mod:`~agents.llm.adapters.trl_tools`); a verl agent loop (:mod:`~agents.llm.adapters.verl`); a policy served
by any OpenAI-compatible server (:mod:`~agents.llm.adapters.served`, torch-free, also the scripted bench's
``openai:MODEL@URL`` strategies and distill's served teacher) and a local vLLM server to serve it
(:mod:`~agents.llm.adapters.vllm_server`, ``python -m agents.llm.adapters.vllm_server``); a saved checkpoint as a
``memenv bench`` strategy (:mod:`~agents.llm.adapters.bench_strategy`). Built on the other sub-packages; none
of them imports it.
"""
