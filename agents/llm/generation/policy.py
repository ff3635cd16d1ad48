"""The LLM policy: batched sampling from any transformers causal LM, token-exact.

For every invocation the policy keeps the ids it was given (``prompt_ids``), the ids it sampled
(``response_ids``) and the behaviour log-probs of those ids (``response_logprobs``); the text handed to the env
is decoded once from ``response_ids``. Nothing downstream re-tokenizes sampled text.

Log-probs convention: ``response_logprobs[t] = log_softmax(logits_t / T)[token_t]`` with ``T`` the temperature
the token was sampled with, *before* top-p truncation (top-p only restricts which tokens can be drawn; the
trainers recompute exactly this quantity for the PPO ratio). With ``temperature=0`` (greedy) ``T=1`` is used.
The quantity is reproduced by :func:`sequence_logprobs` (one sequence, no padding) within 1e-4 in fp32.

Sampling (``generation="tree"``, the default): the prompts are prefilled along their prefix tree, each shared run
of tokens once and without padding, and decoded together from one preallocated KV buffer, a row leaving the batch
when it finishes (:mod:`agents.llm.generation.tree_generation`; :meth:`LLMPolicy.reuse_prefixes` also keeps shared
prefixes across calls). ``generation="padded"`` (the earlier path, kept for comparison): prompts left-padded into one
batch with ``position_ids = cumsum(attention_mask) - 1`` (every row starts at position 0, as when run alone), one
prefill, then a token-by-token loop over every row with the KV cache. Both draw the same uniforms for the same
seed (one per row of the batch per step), so they sample the same tokens up to float rounding. A row stops at the closing tag of the action (``</search>`` or ``</answer>`` by default; any string in
``stop``), at eos, or after ``max_new_tokens``.

Templates: ``template="auto"`` uses ``tokenizer.apply_chat_template`` when the tokenizer has a chat template
(instruct models: the observation is the user message, optional ``system_prompt``), else the plain template
``"{observation}\\n"`` (tiny models of :mod:`agents.llm.models.local`; a bos token is prepended if the tokenizer has
one).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
import operator
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from agents.llm.generation.lean_decode import lean_step
from agents.llm.generation.packed_head import packed_head
from agents.llm.models.local import load_pretrained, model_limits
from agents.llm.generation.tree_generation import PrefixStore, decode_buffers, prefill_tree, supports_tree_generation
from agents.llm.models.prompts import PROTOCOL_SYSTEM_PROMPT  # re-exported: the served policy uses it without torch

DEFAULT_STOP = ("</search>", "</answer>")
GENERATIONS = ("tree", "padded")
PLAIN_TEMPLATE = "{observation}\n"


@dataclass
class Generation:
    """One sampled invocation (before it meets the env)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    text: str  # decode(response_ids, skip_special_tokens=True): what the env receives
    finish_reason: str  # "stop" (a stop string), "eos" or "length"
    temperature: float  # the T of response_logprobs (1.0 for greedy)
    extra: dict[str, Any] = field(default_factory=dict)


def _forward_kwargs(model) -> tuple[str, str | None]:
    """Names of the cache argument and of the keep-last-logits argument across transformers versions."""
    params = inspect.signature(model.forward).parameters
    cache = "cache" if "cache" in params else "past_key_values"
    keep = "logits_to_keep" if "logits_to_keep" in params else ("num_logits_to_keep" if "num_logits_to_keep" in params else None)
    return cache, keep


def _get_cache(out) -> Any:
    for name in ("cache", "past_key_values"):
        value = out.get(name) if hasattr(out, "get") else getattr(out, name, None)
        if value is not None:
            return value
    raise RuntimeError("the model returned no KV cache (use_cache=True)")


def resolve_system_prompt(system_prompt: str | None, tokenizer) -> str | None:
    """``"checkpoint"``: the system prompt saved with the tokenizer's checkpoint (``memenv_prompt.json``, see
    :func:`agents.llm.models.prompt_settings.read_prompt_settings`), else none; ``"protocol"``:
    :data:`PROTOCOL_SYSTEM_PROMPT`; ``None``: no system message (the chat template's own default, if it has one);
    any other string is the prompt."""
    if system_prompt == "checkpoint":
        system_prompt = (getattr(tokenizer, "memenv_prompt", None) or {}).get("system_prompt")
    if system_prompt == "protocol":
        return PROTOCOL_SYSTEM_PROMPT
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValueError(f"system_prompt must be a string or None, got {type(system_prompt).__name__}")
    return system_prompt


class PromptFormat:
    """Observation text -> prompt ids (chat template or plain template; see the module doc). Needs no model:
    :class:`LLMPolicy` and the serving adapters (verl) encode prompts the same way."""

    def __init__(self, tokenizer, template: str = "auto", system_prompt: str | None = "checkpoint",
                 plain_template: str = PLAIN_TEMPLATE, max_prompt_tokens: int | None = None) -> None:
        if template not in ("auto", "chat", "plain"):
            raise ValueError(f"template must be 'auto', 'chat' or 'plain', got {template!r}")
        self.tokenizer = tokenizer
        self.use_chat = template == "chat" or (template == "auto" and bool(getattr(tokenizer, "chat_template", None)))
        if self.use_chat and not getattr(tokenizer, "chat_template", None):
            raise ValueError("template='chat' but the tokenizer has no chat template")
        self.system_prompt = resolve_system_prompt(system_prompt, tokenizer)
        self.plain_template = plain_template
        self.max_prompt_tokens = max_prompt_tokens

    def prompt_text(self, observation: str) -> str:
        if self.use_chat:
            messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
            messages.append({"role": "user", "content": observation})
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.plain_template.format(observation=observation)

    def encode_prompt(self, observation: str) -> list[int]:
        """The prompt ids of one observation (the same for sampling, SFT and scoring)."""
        ids = list(self.tokenizer.encode(self.prompt_text(observation), add_special_tokens=False))
        bos = self.tokenizer.bos_token_id
        if not self.use_chat and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            ids = ids[-self.max_prompt_tokens:]
        return ids


def _whole(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
    return int(value)


def check_sampling_options(*, temperature: Any, top_p: Any, max_new_tokens: Any, batch_size: Any, stop: Any,
                           max_prompt_tokens: Any = None, context: int | None = None) -> None:
    """Refuse (``ValueError``, one line naming the argument and its limit) sampling options that would crash
    deep in torch or sample silently wrong: ``temperature`` a finite number >= 0, ``top_p`` in (0, 1],
    ``max_new_tokens`` and ``batch_size`` whole numbers >= 1, ``stop`` a list of non-empty strings (an empty
    one is in every text and would end every action after its first token; a bare string would be read as its
    characters), ``max_prompt_tokens`` (None or >= 1) plus ``max_new_tokens`` within the model's ``context``
    (max positions) when both are known."""
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1: off), got {top_p!r}")
    _whole("max_new_tokens", max_new_tokens, 1)
    _whole("batch_size", batch_size, 1)
    if isinstance(stop, (str, bytes)) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
    if max_prompt_tokens is not None:
        _whole("max_prompt_tokens", max_prompt_tokens, 1)
    if context is not None and max_new_tokens > context:
        raise ValueError(f"max_new_tokens {max_new_tokens} exceeds the model's context window of {context} positions")
    if context is not None and max_prompt_tokens is not None and max_prompt_tokens + max_new_tokens > context:
        raise ValueError(f"max_prompt_tokens {max_prompt_tokens} + max_new_tokens {max_new_tokens} exceed the "
                         f"model's context window of {context} positions")


def check_prompt_ids(prompts: Sequence[Sequence[int]], vocab: int, context: int | None,
                     max_new_tokens: int) -> list[list[int]]:
    """The prompts as lists of int ids, or a ``ValueError`` naming the first prompt that is empty, holds an id
    that is not a whole number in ``[0, vocab)`` (the model's embedding rows: another id crashes in the embedding
    or, on a GPU, aborts the process) or, with its ``max_new_tokens``, does not fit the model's ``context``
    window (positions past it give silently wrong logits, or a crash)."""
    out = []
    for n, prompt in enumerate(prompts):
        ids = []
        for token in prompt:
            try:
                if isinstance(token, bool):
                    raise TypeError
                token = operator.index(token)
            except TypeError:
                raise ValueError(f"prompt {n}: token id {token!r} is not a whole number") from None
            if not 0 <= token < vocab:
                raise ValueError(f"prompt {n}: token id {token} is outside the model's vocabulary [0, {vocab})")
            ids.append(token)
        if not ids:
            raise ValueError(f"prompt {n} is empty: every prompt needs at least one token id")
        if context is not None and len(ids) + max_new_tokens > context:
            raise ValueError(f"prompt {n}: {len(ids)} tokens + max_new_tokens {max_new_tokens} exceed the model's "
                             f"context window of {context} positions (set max_prompt_tokens, or a context budget "
                             "on the env)")
        out.append(ids)
    return out


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None = None,
                       uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One id per row of ``probs`` ``[B, V]`` (non-negative weights, not necessarily normalised), drawn with
    probability proportional to its weight: one uniform per row against the row's float64 cumulative sum.

    The same distribution as ``torch.multinomial(probs, 1)``, ~20x cheaper on CPU over a 49k-entry vocabulary
    (``benchmarks/sampler_speed.py``, 1 thread: 0.8 vs 18.8 ms for 8 rows at V = 49,152; rollouts of a 2-layer
    SmolLM2 cut 1.14x the tokens/s). A zero-weight id (one top-p removed) is never drawn: the uniform stays below
    the row's total, and ``right=True`` returns the first id whose cumulative sum exceeds it, so that id adds a
    positive weight. ``uniforms`` ``[B, 1]`` float64 in [0, 1): the draws to use instead of ``generator``'s."""
    cdf = probs.to(torch.float64).cumsum(-1)
    total = cdf[:, -1:]
    if not bool((total > 0).all()) or not bool(torch.isfinite(total).all()):
        raise ValueError("inverse_cdf_sample needs finite weights with a positive sum in every row")
    if uniforms is None:
        uniforms = torch.rand(total.shape, generator=generator, dtype=torch.float64)
    u = uniforms.to(torch.float64).reshape(total.shape) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u * total may round up to total
    return torch.searchsorted(cdf, u, right=True)[:, 0]


class LLMPolicy:
    """Sampling policy over a causal LM.

    Args:
        model: a ``transformers`` causal LM, or a local path (loaded with :func:`agents.llm.models.local.load_pretrained`).
        tokenizer: its tokenizer (required with an in-memory model).
        temperature: sampling temperature; 0 means greedy.
        top_p: nucleus sampling threshold (1.0: off).
        max_new_tokens: per invocation.
        stop: strings that end an action (the closing tags); eos always stops.
        template: ``"auto"`` | ``"chat"`` | ``"plain"``.
        system_prompt: system message for chat templates: ``"checkpoint"`` (default: the one saved with the
            model, else none), ``"protocol"`` (:data:`PROTOCOL_SYSTEM_PROMPT`), ``None`` or any string.
        batch_size: rows per forward pass.
        seed: seeds the sampling generator (reproducible rollouts).
        generation: ``"tree"`` (prefix-tree prefill, early exit) or ``"padded"`` (one left-padded batch); see
            the module doc. Models whose cache is not plain full attention always use ``"padded"``.
        fast_decode: the tree path's decode steps run :func:`agents.llm.generation.lean_decode.lean_step` (the forward's
            operations without its per-call machinery; the same logits bit for bit) where the model is one it
            knows. Off by default: on SmolLM2 at 1 thread no gain beyond the noise (decode per CPU-second 1.03 ± 0.05x,
            ``benchmarks/rollout_throughput.py``, docs/real_models.md).
        compile_decode: the tree path's decode steps run through ``torch.compile``
            (:mod:`agents.llm.generation.compiled_decode`: the lean step's operations, the KV buffer written in place by one
            opaque attention op) where the model is one the lean step knows; the logits agree with the eager
            step to float rounding. Off by default: decode per CPU-second 1.12 ± 0.04x on SmolLM2 at 1 thread,
            for ~108 CPU-s of compiling once per process (docs/real_models.md).
        packed_head: the tree path's decode steps (not the compiled ones) compute the LM head's product on its
            weight reordered once per batch for oneDNN (:mod:`agents.llm.generation.packed_head`: 1.5-1.9x on the
            head at 8 rows on the AVX2 host; the logits within ~1e-6 relative of the forward's). On by default;
            a head it does not fit (not a plain fp32 ``nn.Linear`` on the CPU, or under 4 MiB, where the reorder
            does not pay: the tiny experiment models' heads) keeps its own forward.

    ``stats`` counts, over the policy's life: ``prompt_tokens`` (the prompts' tokens), ``prefill_tokens`` (those
    actually run through the model, padding included), ``decode_rows`` (row-steps of the decode loop),
    ``generated_tokens``, ``prefill_s`` / ``decode_s`` (wall-clock seconds of each phase) and ``prefill_cpu_s`` /
    ``decode_cpu_s`` (this process's CPU seconds in each: the figure that holds on a shared machine).
    """

    def __init__(self, model, tokenizer=None, *, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 128, stop: Sequence[str] = DEFAULT_STOP, template: str = "auto",
                 system_prompt: str | None = "checkpoint", plain_template: str = PLAIN_TEMPLATE, batch_size: int = 64,
                 max_prompt_tokens: int | None = None, seed: int | None = 0, generation: str = "tree",
                 fast_decode: bool = False, compile_decode: bool = False, packed_head: bool = True) -> None:
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            model, loaded_tok = load_pretrained(model)
            tokenizer = tokenizer or loaded_tok
        if tokenizer is None:
            raise ValueError("LLMPolicy needs the tokenizer of an in-memory model")
        check_sampling_options(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                               batch_size=batch_size, stop=stop, max_prompt_tokens=max_prompt_tokens,
                               context=model_limits(model)[1])
        if generation not in GENERATIONS:
            raise ValueError(f"generation must be one of {', '.join(GENERATIONS)}, got {generation!r}")
        self.format = PromptFormat(tokenizer, template, system_prompt, plain_template, max_prompt_tokens)
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_new_tokens = int(max_new_tokens)
        self.stop = tuple(stop)
        self.use_chat = self.format.use_chat
        self.system_prompt = self.format.system_prompt
        self.plain_template = plain_template
        self.batch_size = int(batch_size)
        self.max_prompt_tokens = max_prompt_tokens
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token")
        eos = tokenizer.eos_token_id
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos_ids |= set(gen_eos if isinstance(gen_eos, (list, tuple)) else [] if gen_eos is None else [gen_eos])
        self.eos_ids = eos_ids
        # Stop strings that are one *added* token (the tiny tokenizers' protocol tags) are matched on ids: an added
        # token is always split out whole. Any other string is matched on the decoded tail, since real BPE can
        # sample it inside other tokens (SmolLM2 writes "memory" as "memory" but also inside " memory" or
        # "memory>"; matching the one id missed those).
        added_ids = set(getattr(tokenizer, "get_added_vocab", dict)().values())
        self.stop_ids: set[int] = set()
        self.stop_strings: list[str] = []
        for s in self.stop:
            ids = tokenizer.encode(s, add_special_tokens=False)
            if len(ids) == 1 and ids[0] in added_ids and tokenizer.decode(ids) == s:
                self.stop_ids.add(ids[0])
            else:
                self.stop_strings.append(s)
        self._tail = max((len(s) for s in self.stop_strings), default=0) + 4
        self._cache_arg, self._keep_arg = _forward_kwargs(model)
        self.generator = torch.Generator(device="cpu")
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self.last: Generation | None = None
        self.generation = generation
        self._tree_ok = supports_tree_generation(model)
        self.fast_decode = bool(fast_decode)
        self.compile_decode = bool(compile_decode)
        self.packed_head = bool(packed_head)
        self._compiled: Any = None  # the policy's CompiledStep (built on the first decode), False: none fits
        self._store: PrefixStore | None = None
        self.stats = dict.fromkeys(("prompt_tokens", "prefill_tokens", "decode_rows", "generated_tokens"), 0)
        self.stats.update(prefill_s=0.0, decode_s=0.0, prefill_cpu_s=0.0, decode_cpu_s=0.0)
        # Called with the number of tokens each decoding step generated (the rows still running), so that a
        # progress bar moves inside an invocation; rollout(progress=True) sets it for its duration.
        self.on_tokens: Callable[[int], None] | None = None

    # ------------------------------------------------------------------ prompts
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_text(self, observation: str) -> str:
        return self.format.prompt_text(observation)

    def encode_prompt(self, observation: str) -> list[int]:
        """The prompt ids of one observation (the same for sampling, SFT and scoring)."""
        return self.format.encode_prompt(observation)

    def encode_action(self, action: str) -> list[int]:
        """Ids of an expert action (SFT targets). Sampled actions are never re-encoded."""
        return list(self.tokenizer.encode(action, add_special_tokens=False))

    # ------------------------------------------------------------------ policy API
    def reset(self, env: Any = None) -> None:
        """Scripted-policy compatible; the LLM policy keeps no per-episode state."""

    def act(self, observation: str) -> str:
        self.last = self.generate([observation])[0]
        return self.last.text

    def generate(self, observations: Sequence[str]) -> list[Generation]:
        prompts = [self.encode_prompt(o) for o in observations]
        return self.generate_ids(prompts)

    def generate_ids(self, prompts: Sequence[Sequence[int]]) -> list[Generation]:
        out: list[Generation] = []
        prompts = check_prompt_ids(prompts, *model_limits(self.model), self.max_new_tokens)
        tree = self.generation == "tree" and self._tree_ok
        # Within one call the weights cannot change: batches of the call share their prefixes.
        store = self._store if self._store is not None else PrefixStore()
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(prompts), self.batch_size):
                batch = prompts[start:start + self.batch_size]
                out.extend(self._generate_tree(batch, store) if tree else self._generate_batch(batch))
        finally:
            self.model.train(was_training)
        return out

    @contextlib.contextmanager
    def reuse_prefixes(self, max_tokens: int = 8192) -> Iterator[PrefixStore]:
        """Keep the KV of shared prompt prefixes across the generation calls inside the ``with`` block (a rollout's
        turns repeat the system prompt and the question). The caller promises the weights do not change inside it.
        Nested blocks share the outer store."""
        if self._store is not None:
            yield self._store
            return
        self._store = PrefixStore(max_tokens)
        try:
            yield self._store
        finally:
            self._store = None

    # ------------------------------------------------------------------ sampling
    def _sample(self, logits: torch.Tensor, uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled ids and their log-probs (temperature-scaled, before top-p) for a (B, V) fp32 logits;
        ``uniforms`` [B, 1]: the draws to use (default: drawn from the policy's generator)."""
        if self.temperature == 0:
            logp = torch.log_softmax(logits, dim=-1)
            token = logits.argmax(dim=-1)
            return token, logp.gather(-1, token[:, None])[:, 0]
        logp = torch.log_softmax(logits / self.temperature, dim=-1)
        probs = logp.exp()
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < self.top_p  # always keeps the most likely token
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        token = inverse_cdf_sample(probs.cpu(), self.generator, uniforms).to(logits.device)
        return token, logp.gather(-1, token[:, None])[:, 0]

    def _stopped(self, response: list[int]) -> str | None:
        last = response[-1]
        if last in self.stop_ids:
            return "stop"
        if last in self.eos_ids:
            return "eos"
        if self.stop_strings:
            tail = self.tokenizer.decode(response[-self._tail:], skip_special_tokens=False)
            if any(s in tail for s in self.stop_strings):
                return "stop"
        return None

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]]) -> list[Generation]:
        device = self.device
        n = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p):] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        t0, c0 = time.perf_counter(), time.process_time()
        kwargs: dict[str, Any] = {"use_cache": True}
        if self._keep_arg:
            kwargs[self._keep_arg] = 1
        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, **kwargs)
        cache = _get_cache(out)
        logits = out.logits[:, -1].float()
        next_pos = positions[:, -1] + 1
        t1, c1 = time.perf_counter(), time.process_time()
        responses: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        for step in range(self.max_new_tokens):
            token, logp = self._sample(logits)
            token_list, logp_list = token.tolist(), logp.tolist()
            running = 0
            for i in range(n):
                if reasons[i] is None:
                    responses[i].append(token_list[i])
                    logprobs[i].append(logp_list[i])
                    reasons[i] = self._stopped(responses[i])
                    running += 1
            if self.on_tokens is not None:
                self.on_tokens(running)
            if all(r is not None for r in reasons) or step == self.max_new_tokens - 1:
                break
            done = torch.tensor([r is not None for r in reasons], device=device)
            feed = torch.where(done, torch.full_like(token, self.pad_id), token)
            attention = torch.cat([attention, torch.ones((n, 1), dtype=attention.dtype, device=device)], dim=1)
            out = self.model(input_ids=feed[:, None], attention_mask=attention, position_ids=next_pos[:, None],
                             use_cache=True, **{self._cache_arg: cache})
            cache = _get_cache(out)
            logits = out.logits[:, -1].float()
            next_pos = next_pos + 1
            self.stats["decode_rows"] += n
        self._count(prompts, responses, n * width, (t1 - t0, c1 - c0),
                    (time.perf_counter() - t1, time.process_time() - c1))
        return self._generations(prompts, responses, logprobs, reasons)

    def _count(self, prompts, responses, prefill_tokens: int, prefill: tuple[float, float],
               decode: tuple[float, float]) -> None:
        """Add one batch to :attr:`stats` (``prefill`` and ``decode``: wall and CPU seconds)."""
        self.stats["prompt_tokens"] += sum(map(len, prompts))
        self.stats["prefill_tokens"] += int(prefill_tokens)
        self.stats["generated_tokens"] += sum(map(len, responses))
        self.stats["prefill_s"] += prefill[0]
        self.stats["prefill_cpu_s"] += prefill[1]
        self.stats["decode_s"] += decode[0]
        self.stats["decode_cpu_s"] += decode[1]

    def _generations(self, prompts, responses, logprobs, reasons) -> list[Generation]:
        n = len(prompts)
        temperature = self.temperature if self.temperature > 0 else 1.0
        return [
            Generation(prompt_ids=prompts[i], response_ids=responses[i], response_logprobs=logprobs[i],
                       text=self.tokenizer.decode(responses[i], skip_special_tokens=True),
                       finish_reason=reasons[i] or "length", temperature=temperature)
            for i in range(n)
        ]


    @torch.no_grad()
    def _generate_tree(self, prompts: list[list[int]], store: PrefixStore | None) -> list[Generation]:
        """Prefix-tree prefill, buffer decode, early exit (:mod:`agents.llm.generation.tree_generation`)."""
        device = self.device
        n = len(prompts)
        lengths = [len(p) for p in prompts]
        keep = {self._keep_arg: 1} if self._keep_arg else {}
        computed = [0]

        def ran(tokens: int) -> None:
            computed[0] += tokens

        t0, c0 = time.perf_counter(), time.process_time()
        kv_rows, logits = prefill_tree(self.model, prompts, keep, store, ran, self._cache_arg)
        cache, mask = decode_buffers(kv_rows, lengths, self.max_new_tokens)
        del kv_rows
        t1, c1 = time.perf_counter(), time.process_time()
        layers = cache.layers
        step_fn = self._compiled_step() or (lean_step(self.model) if self.fast_decode else None)
        length = layers[0].length  # filled columns (the same in every layer)
        rows = list(range(n))  # the batch's rows, as indices of prompts
        positions = torch.tensor(lengths, dtype=torch.long, device=device)
        responses: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        compiled = step_fn is not None and step_fn is self._compiled
        with packed_head(self.model, self.packed_head and not compiled):
            for step in range(self.max_new_tokens):
                # One uniform per prompt per step, drawn as the padded path draws them (same seed, same tokens).
                uniforms = None
                if self.temperature > 0:
                    uniforms = torch.rand((n, 1), generator=self.generator, dtype=torch.float64)[rows]
                token, logp = self._sample(logits, uniforms)
                token_list, logp_list = token.tolist(), logp.tolist()
                for j, i in enumerate(rows):
                    responses[i].append(token_list[j])
                    logprobs[i].append(logp_list[j])
                    reasons[i] = self._stopped(responses[i])
                if self.on_tokens is not None:
                    self.on_tokens(len(rows))
                if step == self.max_new_tokens - 1:
                    break
                alive = [j for j, i in enumerate(rows) if reasons[i] is None]
                if not alive:
                    break
                if len(alive) < len(rows):  # finished rows leave; so do columns that are padding for all the rest
                    rows = [rows[j] for j in alive]
                    index = torch.tensor(alive, dtype=torch.long, device=device)
                    lead = int(mask[index, :length].argmax(dim=1).min())  # first column any remaining row uses
                    for layer in layers:
                        layer.keep(index, lead)
                    mask, length = mask[index, lead:], length - lead
                    token, positions = token[index], positions[index]
                if step_fn is not None:
                    logits = step_fn(token[:, None], positions[:, None], mask[:, :length + 1], layers).float()
                else:
                    out = self.model(input_ids=token[:, None], attention_mask=mask[:, :length + 1],
                                     position_ids=positions[:, None], use_cache=True, **{self._cache_arg: cache})
                    logits = out.logits[:, -1].float()
                length += 1
                positions = positions + 1
                self.stats["decode_rows"] += len(rows)
        self._count(prompts, responses, computed[0], (t1 - t0, c1 - c0),
                    (time.perf_counter() - t1, time.process_time() - c1))
        return self._generations(prompts, responses, logprobs, reasons)

    def _compiled_step(self):
        """The policy's compiled decode step (built once: its compiled graphs are kept across calls), or None."""
        if not self.compile_decode:
            return None
        if self._compiled is None:
            from agents.llm.generation.compiled_decode import compiled_step

            self._compiled = compiled_step(self.model) or False
        return self._compiled or None


# ---------------------------------------------------------------------- scoring
@torch.no_grad()
def sequence_logprobs(model, prompt_ids: Sequence[int], response_ids: Sequence[int],
                      temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of ``response_ids`` after ``prompt_ids``: one sequence, no padding, positions from 0.

    ``log_softmax(logits / temperature)`` at the response positions, fp32 (the convention of
    :class:`LLMPolicy`). Used to check records round-trip."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
    finally:
        model.train(was_training)
    start = len(prompt_ids)
    logits = logits[start - 1: start - 1 + len(response_ids)] / temperature
    target = ids[0, start:start + len(response_ids)]
    return torch.log_softmax(logits, dim=-1).gather(-1, target[:, None])[:, 0].cpu()
