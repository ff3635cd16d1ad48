"""Numeric wrappers: MemQA as fixed-size observations and discrete macro-actions (Stable-Baselines3, ...).

:class:`MemQANumeric` turns the text env into spaces that off-the-shelf RL libraries accept:

- **observation** ``Box(0, 1, (D,), float32)``: hashed bag-of-words of the current question, the memory and
  the newest search results (``zlib.crc32`` buckets, stable across processes, unlike Python's salted
  ``hash``), global counters (turns left, candidates, memory size, ...) and per-slot features of the
  candidate strings, the newest result sentences and the memory items;
- **action** ``Discrete(2C + R + M)`` macro-actions, expanded into protocol text:

  =====================  =========================================================================
  ``[0, C)``             search for candidate ``i``: ``<memory>…</memory><search>CANDIDATE</search>``
  ``[C, 2C)``            answer the current question with candidate ``i`` (see *objectives* below)
  ``[2C, 2C+R)``         keep result sentence ``j`` in the memory (an edit of the memory draft)
  ``[2C+R, 2C+R+M)``     drop memory item ``j`` (an edit of the memory draft)
  =====================  =========================================================================

Candidates are the strings a policy can act on, read off the observation text only (never the gold task):
capitalised names (the regex below, minus question words and sentence openers) and numbers, from the
questions, the memory and the newest results. Question names come first (so *search slot 0* is the
current question's first named entity); the others are ranked by a lexical relevance to the current
question (co-occurrence with a question name or an entity already searched, shared word stems). Memory
items are sentences; the memory text sent with each search or answer is ``Answer k: …`` lines for the
questions already answered (below) followed by the kept sentences, so the env's memory is exactly what the
wrapper keeps.

Memory edits (keep/drop) do not call the env: they change the draft sent with the next search or answer,
at most ``max_edits`` per env turn, with reward 0. The env's own turn limit still bounds the episode.

**Objectives.** The default task has one question. With ``objectives=N > 1`` the questions are answered in
order: *answer* for questions ``1..N-1`` records a draft (kept in the memory as ``Answer k: …``, no env
call) and moves the focus to the next question; the answer for question ``N`` submits
``<answer>a1; …; aN</answer>``. Question features always describe the question in focus.

**Masks.** :meth:`MemQANumeric.action_masks` is False exactly for macro-actions that cannot be expanded:
empty candidate/sentence/memory slots, keeping a sentence already kept or into a full memory, and edits
beyond ``max_edits``. sb3-contrib's ``MaskablePPO`` reads it. An unmasked policy (plain PPO) that picks such
an action sends ``<memory>…</memory><search></search>`` to the env, which rejects it as an invalid action:
the turn is used and ``info["invocation"]["error"]`` says why.

**Infos.** ``info["macro"]`` describes the macro-action, ``info["action_text"]`` is the protocol text sent
(None for a memory edit or an answer draft), ``info["invocation"]`` the env's snapshot when the env was
stepped. At the end of an episode ``info["f1"]``/``info["em"]`` hold the scores and ``info["summary"]``
the env's episode summary (the key is not ``"episode"``: Stable-Baselines3's ``Monitor`` owns that one).

Default task (:data:`DEFAULT_TASK`, small enough for PPO to learn on a CPU in minutes): ``objectives=1,
hops=1, corpus_size=300, top_k=3, invalid_penalty=0.1``; pass MemQA kwargs to change it (``hops=2``,
``objectives=4``, ...). ``examples/sb3_ppo.py`` measured, on held-out seeds after 60k steps each (4.1 min
wall on 2 shared cores): F1 random 0.05, masked-random 0.10, PPO 0.67, MaskablePPO 0.70. Example::

    import torch
    from sb3_contrib import MaskablePPO
    from memenv.wrappers import MemQANumeric
    torch.set_num_threads(1)  # see benchmarks/sb3_snippet_speed.py: more threads only cost time here
    model = MaskablePPO("MlpPolicy", MemQANumeric(), seed=0).learn(100_000)

The wrapper steps ~800-1,400 times per second on one core; on a shared 2-core machine, torch's default of
one thread per core makes SB3's small MLP updates (not the wrapper) the bottleneck, several times over.
"""

from __future__ import annotations

import functools
import re
import zlib
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from memenv.protocol import format_action

# Capitalised names, as the synthetic world and most English text write them ("The Silent Harbor of X").
NAME = re.compile(r"[A-Z][A-Za-z'\-]*(?: (?:of )?[A-Z][A-Za-z'\-]*)*")
NUMBER = re.compile(r"(?<![\w.])\d+(?![\w])")
# One-word matches of NAME that are sentence openers or question words, not names.
NOT_NAMES = frozenset(
    "A An And As At But By Critics Did Do Does Each For From He Her His How If In Is It Its No Of On Or "
    "She So That The Their Then There These They This Those To Visitors Was Were What When Where Which "
    "Who Whom Whose Why With Yes".split()
)
STOPWORDS = frozenset(
    "a an and are as at be by did do does for from has have in is it its of on or the their to was were "
    "what when where which who whom whose why with how many much".split()
)
_WORD = re.compile(r"[a-z]+|\d+")
_DOC_HEADER = re.compile(r"Doc \d+ \(Title: ([^)\n]*)\)\s*")
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_INFORMATION = re.compile(r"<information>(.*?)</information>", re.DOTALL)
_MEMORY = re.compile(r"<memory>\n?(.*?)\n?</memory>", re.DOTALL)
_BRACKET_LINE = re.compile(r"^\[[^\]\n]*\]$", re.MULTILINE)
_QUESTION_LINE = re.compile(r"^Question (\d+): (.*)$", re.MULTILINE)
_TURNS_LEFT = re.compile(r"\[turns left: (\d+)\]")

# invalid_penalty: an unmasked policy (plain PPO) learns to avoid invalid macro-actions; masked ones never take them.
DEFAULT_TASK: dict[str, Any] = {"objectives": 1, "hops": 1, "corpus_size": 300, "top_k": 3, "invalid_penalty": 0.1}

# Per-slot feature counts (the layout is documented in MemQANumeric.feature_names()).
_CANDIDATE_FEATURES = ("exists", "in_focus_question", "in_any_question", "in_memory", "in_results",
                       "is_title", "searched", "is_number", "cooccurs_with_anchor", "shared_stems",
                       "documents", "answered")
_SENTENCE_FEATURES = ("exists", "shared_stems", "has_anchor", "in_memory", "candidates")
_MEMORY_FEATURES = ("exists", "shared_stems", "has_anchor", "is_answer_line")
_GLOBAL_FEATURES = ("turns_left", "last_turn", "candidates", "memory_items", "edits_left", "answered",
                    "searches", "no_results_yet", "last_invalid", "objectives")


def crc_bucket(token: str, dim: int, salt: str = "") -> int:
    """A fixed hash bucket (zlib.crc32: the same in every process, unlike ``hash``)."""
    return zlib.crc32(f"{salt}\x1f{token}".encode("utf-8")) % dim


@functools.lru_cache(maxsize=65536)
def words(text: str) -> tuple[str, ...]:
    """Lower-cased word tokens; numbers become ``<num>``."""
    return tuple("<num>" if w.isdigit() else w for w in _WORD.findall(text.lower()))


@functools.lru_cache(maxsize=65536)
def stems(text: str, exclude: str = "") -> frozenset[str]:
    """Content-word stems (first five letters) of ``text``, minus stopwords and the words of ``exclude``."""
    skip = set(words(exclude)) | STOPWORDS
    return frozenset(w[:5] for w in words(text) if w not in skip and w != "<num>")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_SPLIT.split(text) if s.strip()]


def extract_candidates(text: str) -> list[str]:
    """Names and numbers in ``text``, in order of first appearance."""
    found: list[tuple[int, str]] = []
    for match in NAME.finditer(text):
        name = match.group(0)
        if " " not in name and name in NOT_NAMES:
            continue
        first, _, rest = name.partition(" ")
        if rest and first in NOT_NAMES and first != "The":  # "In Paris" at a sentence start -> "Paris"
            name = rest
        found.append((match.start(), name))
    found += [(m.start(), m.group(0)) for m in NUMBER.finditer(text)]
    return list(dict.fromkeys(name for _, name in sorted(found)))


@functools.lru_cache(maxsize=65536)
def names_in(text: str) -> frozenset[str]:
    """The candidate strings of ``text`` as a set (whole names only: "Jiagol" is not in "North Jiagol")."""
    return frozenset(extract_candidates(text))


def _contains(text: str, name: str) -> bool:
    return name in names_in(text)


class MemQANumeric(gym.Wrapper):
    """MemQA with a ``Box`` observation and ``Discrete`` macro-actions (see the module docstring).

    Args:
        env: a MemQA env (``gym.make("MemQA-v0", ...)`` or :class:`memenv.envs.memqa.MemQAEnv`); when None, one
            is built from :data:`DEFAULT_TASK` updated with ``env_kwargs``.
        candidate_slots: C, candidate strings the policy can search for or answer with.
        result_slots: R, newest-result sentences it can keep (the most relevant to the question first).
        memory_slots: M, sentences the memory holds.
        max_edits: memory edits allowed between two env turns.
        hash_dim: buckets of each hashed bag-of-words (question, memory, results).
        context_dim: buckets of the hashed context words of each candidate.
        **env_kwargs: MemQA kwargs when ``env`` is None (e.g. ``hops=2``, ``objectives=2``).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, env: gym.Env | None = None, *, candidate_slots: int = 8, result_slots: int = 4,
                 memory_slots: int = 3, max_edits: int = 2, hash_dim: int = 32, context_dim: int = 8,
                 **env_kwargs: Any) -> None:
        if env is None:
            from memenv.envs.memqa import MemQAEnv

            env = MemQAEnv(**{**DEFAULT_TASK, **env_kwargs})
        elif env_kwargs:
            raise TypeError("pass either env= or MemQA kwargs, not both")
        base = env.unwrapped
        if not hasattr(base, "questions") or not hasattr(base, "objectives"):
            raise TypeError(f"MemQANumeric wraps MemQA environments, got {type(base).__name__}")
        if min(candidate_slots, result_slots, memory_slots, hash_dim, context_dim) < 1 or max_edits < 0:
            raise ValueError("slot counts and hash sizes must be >= 1, max_edits >= 0")
        super().__init__(env)
        self.C, self.R, self.M = int(candidate_slots), int(result_slots), int(memory_slots)
        self.max_edits = int(max_edits)
        self.hash_dim, self.context_dim = int(hash_dim), int(context_dim)
        self.objectives = int(base.objectives)
        self.action_space = spaces.Discrete(2 * self.C + self.R + self.M)
        size = (3 * self.hash_dim + len(_GLOBAL_FEATURES)
                + self.C * (len(_CANDIDATE_FEATURES) + self.context_dim)
                + self.R * len(_SENTENCE_FEATURES) + self.M * len(_MEMORY_FEATURES))
        self.observation_space = spaces.Box(0.0, 1.0, (size,), np.float32)
        self._questions: list[str] = []
        self._reset_state("")

    # ------------------------------------------------------------------ state
    def _reset_state(self, text: str) -> None:
        self._text = text
        self._items: list[str] = []  # memory sentences kept
        self._drafts: list[str] = []  # answers to questions 1..k (objectives > 1)
        self._searched: list[str] = []
        self._edits_left = self.max_edits
        self._last_invalid = False
        self._done = False
        self._parse()

    def _memory_text(self) -> str:
        lines = [f"Answer {i}: {a}" for i, a in enumerate(self._drafts, 1)] + self._items
        return "\n".join(lines)

    @property
    def focus(self) -> int:
        """Index of the question in focus (the first one without an answer)."""
        return min(len(self._drafts), max(0, len(self._questions) - 1))

    def _parse(self) -> None:
        """Read memory, newest results and candidates off the observation text."""
        text = self._text
        blocks = _INFORMATION.findall(text)
        information = blocks[-1] if blocks else ""
        self._titles = _DOC_HEADER.findall(information)
        body = _BRACKET_LINE.sub("", _DOC_HEADER.sub("\n", information))
        self._no_results = "No search results yet." in body
        self._info_text = "" if self._no_results else body
        self._result_sentences = sentences(self._info_text)
        memory = _MEMORY.findall(text)
        self._env_memory = memory[-1] if memory else ""
        questions = self._questions
        focus_q = questions[self.focus] if questions else ""
        self._focus_stems = stems(focus_q)
        focus_names = extract_candidates(focus_q)
        other_q = [c for q in questions for c in extract_candidates(q) if c not in focus_names]
        anchors = set(focus_names) | set(self._searched)
        memory_sentences = list(self._items)
        pool = memory_sentences + self._result_sentences
        docs = self._docs(information)
        seen: dict[str, dict[str, float]] = {}
        for order, name in enumerate(extract_candidates(" \n".join(pool))):
            containing = [s for s in pool if _contains(s, name)]
            cooc = any(a != name and _contains(s, a) for s in containing for a in anchors)
            shared = max((len(stems(s, exclude=name) & self._focus_stems) for s in containing), default=0)
            seen[name] = {"order": order, "cooc": float(cooc), "shared": float(shared),
                          "docs": float(sum(_contains(d, name) for d in docs))}
        ranked = sorted((n for n in seen if n not in focus_names and n not in other_q),
                        key=lambda n: (-(seen[n]["cooc"] + seen[n]["shared"]), seen[n]["order"]))
        candidates = list(dict.fromkeys(focus_names + other_q + ranked))
        if not candidates and focus_q:  # nothing name-like: the question text is still a useful query
            candidates = [focus_q.rstrip("?")]
        self._candidates = candidates[: self.C]
        self._candidate_stats = seen
        self._anchors = anchors
        # result sentences offered for keeping: the most relevant to the question in focus first
        scored = [(-(len(stems(s) & self._focus_stems) + any(_contains(s, a) for a in anchors)), i, s)
                  for i, s in enumerate(dict.fromkeys(self._result_sentences))]
        self._offered = [s for _, _, s in sorted(scored)][: self.R]

    @staticmethod
    def _docs(information: str) -> list[str]:
        return [d for d in re.split(r"Doc \d+ \(Title: ", information)[1:]]

    # ------------------------------------------------------------------ features
    def _bow(self, text: str, salt: str) -> np.ndarray:
        vec = np.zeros(self.hash_dim, np.float32)
        for w in words(text):
            if w not in STOPWORDS:
                vec[crc_bucket(w, self.hash_dim, salt)] += 1.0
        return np.minimum(1.0, np.log1p(vec) / np.log(4.0))

    def _features(self) -> np.ndarray:
        base = self.env.unwrapped
        questions = self._questions
        focus_q = questions[self.focus] if questions else ""
        shown = _TURNS_LEFT.findall(self._text)  # what the env shows the policy: "[turns left: N]"
        turns_left = int(shown[-1]) if shown else base.max_turns
        parts = [
            self._bow(focus_q, "q"), self._bow(self._memory_text(), "m"), self._bow(self._info_text, "r"),
            np.array([
                turns_left / base.max_turns, float(turns_left <= 1), len(self._candidates) / self.C,
                len(self._items) / self.M, self._edits_left / max(1, self.max_edits),
                len(self._drafts) / max(1, self.objectives), min(1.0, len(self._searched) / base.max_turns),
                float(self._no_results), float(self._last_invalid), min(1.0, self.objectives / 16),
            ], np.float32),
        ]
        memory_text = self._memory_text()
        cand = np.zeros((self.C, len(_CANDIDATE_FEATURES) + self.context_dim), np.float32)
        for k, name in enumerate(self._candidates):
            stats = self._candidate_stats.get(name, {"cooc": 0.0, "shared": 0.0, "docs": 0.0})
            cand[k, : len(_CANDIDATE_FEATURES)] = (
                1.0, float(_contains(focus_q, name)), float(any(_contains(q, name) for q in questions)),
                float(_contains(memory_text, name)), float(_contains(self._info_text, name)),
                float(name in self._titles), float(name in self._searched), float(name.isdigit()),
                stats["cooc"], min(1.0, stats["shared"] / 3.0), min(1.0, stats["docs"] / 3.0),
                float(name in self._drafts),
            )
            for s in self._items + self._result_sentences:  # the words around the candidate
                if _contains(s, name):
                    for w in words(s.replace(name, " ")):
                        if w not in STOPWORDS or w == "in":
                            cand[k, len(_CANDIDATE_FEATURES) + crc_bucket(w, self.context_dim, "c")] = 1.0
        sent = np.zeros((self.R, len(_SENTENCE_FEATURES)), np.float32)
        for j, s in enumerate(self._offered):
            sent[j] = (1.0, min(1.0, len(stems(s) & self._focus_stems) / 3.0),
                       float(any(_contains(s, a) for a in self._anchors)), float(s in self._items),
                       min(1.0, sum(_contains(s, c) for c in self._candidates) / 4.0))
        mem = np.zeros((self.M, len(_MEMORY_FEATURES)), np.float32)
        for j, s in enumerate(self._items[: self.M]):
            mem[j] = (1.0, min(1.0, len(stems(s) & self._focus_stems) / 3.0),
                      float(any(_contains(s, a) for a in self._anchors)), 0.0)
        parts += [cand.ravel(), sent.ravel(), mem.ravel()]
        return np.clip(np.concatenate(parts), 0.0, 1.0).astype(np.float32)

    def feature_names(self) -> list[str]:
        """The name of every observation dimension, in order."""
        names = [f"question_bow[{i}]" for i in range(self.hash_dim)]
        names += [f"memory_bow[{i}]" for i in range(self.hash_dim)]
        names += [f"results_bow[{i}]" for i in range(self.hash_dim)]
        names += list(_GLOBAL_FEATURES)
        for k in range(self.C):
            names += [f"candidate[{k}].{f}" for f in _CANDIDATE_FEATURES]
            names += [f"candidate[{k}].context_bow[{i}]" for i in range(self.context_dim)]
        names += [f"sentence[{j}].{f}" for j in range(self.R) for f in _SENTENCE_FEATURES]
        names += [f"memory[{j}].{f}" for j in range(self.M) for f in _MEMORY_FEATURES]
        return names

    # ------------------------------------------------------------------ actions
    def action_masks(self) -> np.ndarray:
        """Valid macro-actions (bool array of length ``action_space.n``), for sb3-contrib's MaskablePPO."""
        mask = np.zeros(self.action_space.n, bool)
        if self._done:
            mask[:] = True  # nothing is valid after the end; never all-False (MaskablePPO needs one)
            return mask
        n = len(self._candidates)
        mask[:n] = True
        mask[self.C: self.C + n] = True
        if self._edits_left > 0:
            room = len(self._items) < self.M
            for j, s in enumerate(self._offered):
                mask[2 * self.C + j] = room and s not in self._items
            mask[2 * self.C + self.R: 2 * self.C + self.R + min(len(self._items), self.M)] = True
        return mask

    def describe(self, action: int) -> str:
        """A short description of macro-action ``action`` in the current state."""
        action = int(action)
        C, R = self.C, self.R
        if action < C:
            kind, slot, pool = "search", action, self._candidates
        elif action < 2 * C:
            kind, slot, pool = "answer", action - C, self._candidates
        elif action < 2 * C + R:
            kind, slot, pool = "keep", action - 2 * C, self._offered
        else:
            kind, slot, pool = "drop", action - 2 * C - R, self._items
        target = pool[slot] if slot < len(pool) else "<empty slot>"
        return f"{kind} {slot}: {target}"

    def expand(self, action: int) -> str | None:
        """The protocol text macro-action ``action`` sends to the env now (None: a draft-only edit).

        A masked action expands to ``<memory>…</memory><search></search>``, which the env rejects.
        """
        action = int(action)
        if not self.action_masks()[action] or self._done:
            return format_action(self._memory_text(), "search", "")
        if action < self.C:
            return format_action(self._memory_text(), "search", self._candidates[action])
        if action < 2 * self.C:
            if len(self._drafts) + 1 < len(self._questions):
                return None
            answers = self._drafts + [self._candidates[action - self.C]]
            return format_action(self._memory_text(), "answer", "; ".join(answers))
        return None

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        text, info = self.env.reset(seed=seed, options=options)
        questions = info.get("questions")
        if questions is None:  # read them off the task block
            questions = [q for _, q in sorted(_QUESTION_LINE.findall(text), key=lambda m: int(m[0]))]
        self._questions = list(questions)
        self._reset_state(text)
        return self._features(), {"text": text, "questions": list(self._questions),
                                  "episode_id": info.get("episode_id")}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self._done:
            raise RuntimeError("step() called on a finished episode: call reset() first")
        action = int(np.asarray(action).item())
        if not 0 <= action < self.action_space.n:
            raise ValueError(f"action {action} outside Discrete({self.action_space.n})")
        valid = bool(self.action_masks()[action])
        macro = self.describe(action)
        text = self.expand(action)
        info: dict[str, Any] = {"macro": macro, "macro_valid": valid, "action_text": text}
        if text is None:  # an edit of the memory draft or an answer draft: no env call
            if action < 2 * self.C:
                self._drafts.append(self._candidates[action - self.C])
            elif action < 2 * self.C + self.R:
                self._items.append(self._offered[action - 2 * self.C])
                self._edits_left -= 1
            else:
                del self._items[action - 2 * self.C - self.R]
                self._edits_left -= 1
            self._last_invalid = False
            self._parse()
            return self._features(), 0.0, False, False, info
        if valid and action < self.C:
            self._searched.append(self._candidates[action])
        obs_text, reward, terminated, truncated, env_info = self.env.step(text)
        self._text = obs_text
        self._edits_left = self.max_edits
        invocation = env_info.get("invocation", {})
        self._last_invalid = not invocation.get("valid", True)
        # The env may have truncated the memory (memory_budget): keep what it kept.
        kept = invocation.get("memory_after")
        if kept is not None and kept != self._memory_text():
            self._items = [s for s in self._items if s in kept]
        info["invocation"] = invocation
        if terminated or truncated:
            self._done = True
            episode = env_info.get("summary", {})
            info["summary"] = episode
            info["f1"], info["em"] = float(episode.get("f1", 0.0)), float(episode.get("em", 0.0))
        else:
            self._parse()
        return self._features(), float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        lines = [self.env.render() or self._text, "--- macro-actions ---"]
        mask = self.action_masks()
        lines += [f"{a:3d} {'  ' if mask[a] else 'x '}{self.describe(a)}" for a in range(self.action_space.n)]
        return "\n".join(lines) + "\n"


def masked_random_action(env: MemQANumeric, rng: np.random.Generator) -> int:
    """A uniformly random valid macro-action (the baseline a trained policy must beat)."""
    return int(rng.choice(np.flatnonzero(env.action_masks())))
