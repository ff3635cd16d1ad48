"""Models without a hub: what a policy or a trainer loads, and how.

Tiny Qwen2/Llama models built from a config with a tokenizer trained on task text, ``save_pretrained`` /
``load_pretrained`` from local folders (:mod:`~agents.llm.models.local`); the registered real checkpoints and
``memenv models`` (:mod:`~agents.llm.models.pretrained`, with :func:`~agents.llm.models.pretrained.check_checkpoint`,
the one-line check every command runs on a checkpoint folder before loading it, built on
:mod:`~agents.llm.models.folder_checks`); the prompt a checkpoint is given (:mod:`~agents.llm.models.prompts`, the
protocol system prompt, torch-free; :mod:`~agents.llm.models.prompt_settings`, a checkpoint's saved chat settings);
and the dtype, attention kernel and autocast a host computes fast in (:mod:`~agents.llm.models.precision`). The
floor of the LLM stack: it imports no other sub-package of :mod:`agents.llm`.
"""
