"""Tiny causal LMs without a hub: a tokenizer trained on task text and a small Qwen2/Llama config.

Nothing here downloads anything. The tokenizer is a byte-level BPE (lossless: ``decode(encode(t)) == t``)
trained with ``tokenizers`` on the text of oracle trajectories (observations and actions); the protocol tags
(``<memory>``, ``</memory>``, ``<search>``, ``</search>``, ``<answer>``, ``</answer>``, ``<think>``, ``</think>``)
are single added tokens (not "special": they survive ``skip_special_tokens``), and ``<pad>``/``<eos>`` are
special tokens. The tokenizer is wrapped as a :class:`transformers.PreTrainedTokenizerFast`, so everything
downstream (the LLM policy, SFT, PPO, ``distill/``) treats tiny and real checkpoints the same way.

    texts = task_texts("MemQA-v0", {"objectives": 1, "hops": 2}, episodes=200)
    tok = build_tokenizer(texts, vocab_size=4096)
    model = build_tiny_model(tok, hidden_size=128, layers=4)
    save_pretrained(model, tok, "runs/tiny")           # atomic: temp dir, then rename
    model, tok = load_pretrained("runs/tiny")           # any local causal LM checkpoint works too
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from memenv.files import write_directory_atomic
from agents.llm.models.pretrained import resolve
from agents.llm.models.prompt_settings import PROMPT_FILE, read_prompt_settings
from agents.scripted.strategies.qa_strategies import make_strategy

PROTOCOL_TAGS = ("<memory>", "</memory>", "<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>")
PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"


def task_texts(env_id: str = "MemQA-v0", env_kwargs: dict[str, Any] | None = None, episodes: int = 200,
               seed: int = 0, include_corpus: bool = False) -> list[str]:
    """Observations and actions of ``episodes`` oracle trajectories (seeds ``seed..``), the tokenizer's
    training text. ``include_corpus`` adds every corpus document (full coverage of entity names)."""
    import gymnasium as gym

    import memenv  # noqa: F401 - registers the envs

    env = gym.make(env_id, **(env_kwargs or {}))
    policy = make_strategy("oracle", env_id)
    texts: list[str] = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        policy.reset(env.unwrapped)
        while True:
            action = policy.act(obs)
            texts += [obs, action]
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    if include_corpus:
        texts += [f"(Title: {d.title}) {d.text}" for d in getattr(env.unwrapped, "documents", ())]
    env.close()
    return texts


def build_tokenizer(texts: Iterable[str], vocab_size: int = 4096, *, min_frequency: int = 2,
                    byte_alphabet: bool = True, split_spaces: bool | str = True, extra_tokens: Iterable[str] = ()):
    """A byte-level BPE tokenizer trained on ``texts``, as a ``PreTrainedTokenizerFast``.

    Ids: ``<pad>`` 0, ``<eos>`` 1, then the protocol tags (and ``extra_tokens``) as single non-special added
    tokens, then the byte alphabet and merges. ``byte_alphabet=False`` keeps only characters seen in
    ``texts`` (for toy vocabularies of a few dozen tokens; unseen characters are then dropped on encode).

    ``split_spaces`` (default): every whitespace character is its own token, so a word has one tokenization
    whatever precedes it. With GPT-2 style merges ("Ġname" after a space, "name" after ``<search>``) a tiny model
    must learn a spelling map to copy a name from the question into ``<search>name</search>``; with split
    spaces copying is a plain induction copy of the same ids (sequences are ~1.6x longer). Without it
    (``False`` or ``"prefix"``) the tokenizer is the usual GPT-2 style byte-level BPE.

    ``"suffix"``: a word keeps the one plain space that follows it ("Wigei " "is " "a " "city " "in " "Wubuxora"
    "."). Names in this task are copied from where punctuation or a tag follows them (a sentence's object, a
    title, a question's entity) into places where a tag follows them (``<search>name</search>``), so they keep
    one tokenization; sequences are as short as GPT-2 style and copying is an adjacent-token induction.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tags = list(dict.fromkeys([*PROTOCOL_TAGS, *extra_tokens]))
    tok = Tokenizer(models.BPE())
    style = {True: "isolated", False: "prefix"}.get(split_spaces, split_spaces)
    if style not in ("isolated", "prefix", "suffix"):
        raise ValueError(f"split_spaces must be True, False, 'isolated', 'prefix' or 'suffix', got {split_spaces!r}")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=style == "prefix")
    if style == "isolated":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r"\s"), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    elif style == "suffix":  # letters / digits / other symbols, each run with the one plain space after it
        words = Regex(r"[\p{L}\p{M}]+ ?|\p{N}+ ?|[^\s\p{L}\p{M}\p{N}]+ ?|\s")
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(words, behavior="isolated"), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size), min_frequency=int(min_frequency), show_progress=False,
        special_tokens=[PAD_TOKEN, EOS_TOKEN, *tags],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if byte_alphabet else [],
    )
    tok.train_from_iterator(list(texts), trainer)
    # The trainer reserves ids for its special tokens; the protocol tags must stay visible in decoded text,
    # so they are turned into ordinary (non-special) added tokens.
    spec = json.loads(tok.to_str())
    for token in spec["added_tokens"]:
        if token["content"] in tags:
            token["special"] = False
    tok = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN,
                                   clean_up_tokenization_spaces=False, padding_side="left",
                                   model_max_length=1 << 20)


def tiny_config(tokenizer, arch: str = "qwen2", *, hidden_size: int = 128, layers: int = 4, heads: int = 4,
                kv_heads: int | None = None, intermediate_size: int | None = None, max_positions: int = 2048,
                rope_theta: float = 10000.0, tie_embeddings: bool = True, **extra: Any):
    """A small Qwen2 (default) or Llama config sized for ``tokenizer``."""
    from transformers import LlamaConfig, Qwen2Config

    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}.get(arch)
    if cls is None:
        raise ValueError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    if hidden_size % heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by heads {heads}")
    return cls(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_positions, rope_theta=rope_theta, tie_word_embeddings=tie_embeddings,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        attention_dropout=0.0, **extra,
    )


def build_tiny_model(tokenizer, arch: str = "qwen2", *, seed: int = 0, **config_kwargs: Any):
    """A randomly initialised causal LM (fp32) from :func:`tiny_config`."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(tokenizer, arch, **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


FLOAT32_SDPA = "sdpa_float32"  # attention implementation name registered by use_float32_attention


def _sdpa_float32(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention computed in float32 even under a bf16/fp16 autocast (which would otherwise
    cast its inputs down: after RoPE, query and key are already float32 and only the value is bf16)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    device_type = query.device.type
    if not torch.is_autocast_enabled(device_type):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast(device_type, enabled=False):
        return sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)


def use_float32_attention(model) -> None:
    """Compute ``model``'s attention in float32 under a bf16/fp16 autocast; everything else keeps the autocast.

    Why: PyTorch's CPU flash-attention kernel is ~2.7x slower in bf16 than in fp32 at head size 16 (forward +
    backward of a 16 x 8 x 280 x 16 batch: 105 ms vs 39 ms on one core), so on CPU the bf16 forward spent
    half of each SFT step in attention. Not saved with the model: a reload uses plain ``"sdpa"``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(FLOAT32_SDPA, _sdpa_float32)  # idempotent
    # the masks SDPA gets (and its padding / fully-masked-row handling) stay exactly those of "sdpa"
    AttentionMaskInterface.register(FLOAT32_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(FLOAT32_SDPA)


def model_limits(model) -> tuple[int, int | None]:
    """``(vocabulary size, max positions or None)`` of a transformers causal LM: the rows of its input embedding
    (ids at or above it have no embedding) and its config's ``max_position_embeddings``."""
    emb = model.get_input_embeddings()
    vocab = int(getattr(emb, "num_embeddings", None) or emb.weight.shape[0])
    max_pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return vocab, (int(max_pos) if max_pos else None)


class NonFiniteWeightsError(RuntimeError):
    """A model holds NaN or infinite weights: it is not saved (a checkpoint that cannot be trained or run)."""


def non_finite_parameters(*modules) -> list[str]:
    """The names of the parameters and buffers of ``modules`` (None skipped) that hold a NaN or an infinity."""
    import torch

    bad = []
    for module in modules:
        if module is None:
            continue
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor.detach()).all()):
                bad.append(name)
    return bad


def check_finite_weights(path: str | os.PathLike, *modules) -> None:
    """Refuse (:class:`NonFiniteWeightsError`, naming ``path`` and the first parameters) to save ``modules``
    when any of their weights is NaN or infinite."""
    bad = non_finite_parameters(*modules)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise NonFiniteWeightsError(f"{os.fspath(path)}: not saved: {len(bad)} weight tensor(s) hold NaN or "
                                    f"infinite values ({shown}); an earlier checkpoint, if any, stays in place")


def save_pretrained(model, tokenizer, path: str | os.PathLike, extra_files: dict[str, Any] | None = None) -> Path:
    """``save_pretrained`` of model and tokenizer into a temporary sibling folder, then a rename: a reader
    never sees half a checkpoint. An existing ``path`` is replaced. ``extra_files``: name -> callable(path)
    writing more files into the folder before the rename (e.g. optimizer state). A model with a NaN or
    infinite weight is refused before anything is written (:class:`NonFiniteWeightsError`)."""
    check_finite_weights(path, model)

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            settings = getattr(tokenizer, "memenv_prompt", None)
            if settings:  # the prompt format travels with the checkpoint (SFT -> GRPO -> bench see one prompt)
                (tmp / PROMPT_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        for name, write in (extra_files or {}).items():
            write(tmp / name)

    return write_directory_atomic(path, fill)


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer saved in ``path``, exactly as it was saved.

    ``AutoTokenizer`` picks the tokenizer class from the *model* config when the saved class is the generic
    fast tokenizer, and a model-specific class may replace the saved pre-tokenizer with its own (transformers 5
    loads our tiny Qwen2 checkpoints as ``Qwen2Tokenizer``, whose regex splits numbers into digits and glues
    spaces to words): a model trained on one tokenization would be run on another. Tokenizers saved as the
    generic class are therefore loaded as ``PreTrainedTokenizerFast`` from their ``tokenizer.json``; any other
    checkpoint (a real Qwen2.5 or Llama folder) goes through ``AutoTokenizer`` as usual."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(path)
    config_file = path / "tokenizer_config.json"
    saved_class = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.exists() else None
    if saved_class in ("TokenizersBackend", "PreTrainedTokenizerFast") and (path / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def load_pretrained(path: str | os.PathLike, *, dtype: Any = None, device: Any = None,
                    attn_implementation: str = "sdpa"):
    """``(model, tokenizer)`` from a local folder (a tiny model of this module or any causal LM checkpoint).

    Never touches the network. ``dtype``: ``"auto"`` | ``"float32"`` | ``"bfloat16"`` | ``"float16"`` (or fp32 /
    bf16 / fp16, or a torch dtype; :func:`agents.llm.models.precision.resolve_dtype`): None (default) is float32,
    token-exact log-probs; ``"auto"`` is float32 on CPU and bfloat16 on a CUDA ``device`` that supports it.
    ``attn_implementation``: ``sdpa`` (default), ``eager``, ``flex_attention`` or ``flash_attention_2`` (CUDA,
    fp16/bf16, the ``flash_attn`` package; :func:`agents.llm.models.precision.check_attn_implementation` fails clearly
    otherwise, before the weights are read)."""
    from transformers import AutoModelForCausalLM

    from agents.llm.models.precision import check_attn_implementation, resolve_dtype

    torch_dtype = resolve_dtype(dtype, device)
    check_attn_implementation(attn_implementation, torch_dtype, device)
    path = resolve(path)  # a registered name (smollm2-135m-instruct): its prepared folder
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no model checkpoint at {path} (config.json missing)")
    tokenizer = load_tokenizer(path)
    tokenizer.memenv_prompt = read_prompt_settings(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch_dtype,
                                                 attn_implementation=attn_implementation)
    if device is not None:
        model.to(device)
    return model, tokenizer


def make_tiny(path: str | os.PathLike | None = None, env_id: str = "MemQA-v0",
              env_kwargs: dict[str, Any] | None = None, *, episodes: int = 200, vocab_size: int = 4096,
              include_corpus: bool = True, split_spaces: bool | str = True, min_frequency: int = 2, seed: int = 0,
              arch: str = "qwen2", **config_kwargs: Any):
    """Tokenizer from the env's task text + a random-init tiny model; saved to ``path`` when given.

    Returns ``(model, tokenizer)``. Tokenizer text comes from seeds ``10**6 + seed ..`` (not the training
    or evaluation seeds of the trainers)."""
    texts = task_texts(env_id, env_kwargs, episodes=episodes, seed=10**6 + seed, include_corpus=include_corpus)
    tokenizer = build_tokenizer(texts, vocab_size=vocab_size, split_spaces=split_spaces, min_frequency=min_frequency)
    model = build_tiny_model(tokenizer, arch, seed=seed, **config_kwargs)
    if path is not None:
        save_pretrained(model, tokenizer, path)
    return model, tokenizer


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
