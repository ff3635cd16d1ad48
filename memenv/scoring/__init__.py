"""Answer scoring: :mod:`~memenv.scoring.qa` (SQuAD-normalised EM/F1, multi-objective answers),
:mod:`~memenv.scoring.beam` (BEAM's rubric score, judge-free and judged) and :mod:`~memenv.scoring.judges`
(LLM judges through an OpenAI-compatible server)."""

from memenv.scoring.qa import best_em_f1, exact_match, f1_score, normalize_answer

__all__ = ["best_em_f1", "exact_match", "f1_score", "normalize_answer"]
