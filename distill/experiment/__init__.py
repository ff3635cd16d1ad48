"""``memenv experiment memopd``: the MemOPD claims reproduced in miniature, with seed-level statistics, on a CPU.

    memenv experiment memopd --out runs/memopd            # the full run (teacher cached under OUT/teacher)
    memenv experiment memopd --out runs/memopd_quick --quick
    memenv experiment memopd --world fresh --out runs/memopd_fresh   # facts drawn afresh every episode
    memenv experiment memopd --fair --model smollm2-135m-instruct --out runs/memopd_real_fair   # issue 47 (~16 CPU-h)

Worlds (``--world``, :data:`distill.experiment.config.WORLDS`): ``fixed`` (default, described below) keeps one world
whose facts a tiny model can learn by heart; ``fresh`` draws every episode's facts afresh over one inventory of
names and values (MemQA's ``fresh_facts``, 400 documents), so only reading answers, with held-out episodes whose
draws and subject entities no training episode had (docs/design.md); its teacher takes 6,000 demonstrations and a
4,096-token vocabulary, and its stage also reports the teacher's F1 on training draws.

Task: MemQA-v0 with 2 objectives (MemOPD's Q2 setting), single-hop questions, no comparisons and one document per
search (a tiny teacher trained for 70 CPU-minutes reaches F1 0.90 on seen questions there, 0.31 on held-out ones; see
docs/results.md).

Held-out questions: the world (world_seed 0, 1,200 documents) is fixed, and its questions are split before any
training by the entity they ask about (``question_split``, :func:`tasks.world.question_pool`): a quarter of the
entities (``heldout_fraction``) are held out. Every SFT demonstration, tokenizer text, weak-start probe and GRPO
episode draws from the ``train`` pool; the headline evaluation draws from the ``heldout`` pool only, so no
evaluated question (nor any other question about its entity) was ever trained on. F1 on ``train``-pool
("seen") questions, on evaluation seeds, is reported beside it.

Stages, each cached under ``OUT`` and skipped on a rerun when its ``result.json`` exists (resume; a rerun with
other settings is refused, naming them, but the arms' own settings may change while no arm has run;
``--until teacher`` or ``--until student`` stops after that stage, so
the teacher's and the weak start's F1 can be read before the arms are paid for). Inside a stage, the SFT and
the arms resume from their last checkpoint, and each finished greedy evaluation (``*_eval*.csv``) is read back where
its key file (``*.key.json``: the weights' digest, the episodes, the view, the token cap) matches, so an
interrupted stage does not play its finished evaluations again:

1. ``teacher/``: a tiny Qwen2 (d=128, 4 layers) SFT'd on oracle trajectories
   (:func:`agents.llm.training.sft.train_sft`);
2. ``student/``: a smaller model (d=64, 2 layers) with the *teacher's tokenizer*, from a weak SFT (rounds until
   a probe F1 reaches ``student_start_f1``; with ``student_start_ratio``, until the first probe in
   (``student_start_f1``, ratio x the teacher's F1]); its greedy F1/EM per evaluation episode is the common start
   of every arm;
3. ``arms/ARM/seedS/``: from that start, the same number of GRPO updates with the same hyper-parameters
   (:data:`ARMS`): ``rl`` (GRPO alone), ``memopd`` (GRPO + on-policy distillation, actor and teacher on the
   aligned reconstruction), ``teacher_persistent`` (the matched control: the student's update is MemOPD's, only
   the teacher scores each action after the flattened episode), ``flattening`` (actor and teacher on the
   flattened episode, old log-probs recomputed on it, as flattening multi-turn trainers do) and, on request,
   ``memopd_himpo`` (MemOPD + HiMPO memory credit); held-out F1 at ``curve_every`` updates and at the end, seen
   F1 at the end;
4. ``timing.csv``: actor forward+backward CPU seconds per update, padded (record order, and length-sorted
   buckets: the best padded baseline) vs shared-prefix and prefix-tree packing, on one update's records;
   ``diagnostics.csv``: :func:`distill.diagnose.diagnose` of the flattening arm's final student (how far the
   flattened transcript moves the log-probs from the sampled ones);
5. ``results.csv`` (one row per arm), ``comparisons.csv`` (arm pairs), ``results.md`` and ``learning_curves.png``
   (held-out F1 per arm over updates, mean ± SE across training seeds), written atomically.

Statistics (:mod:`distill.stats`): the start and every arm's end are evaluated on the same episodes, and each
arm is trained from ``seeds`` training seeds. Per training seed, the gain is the paired mean
``g_s = mean_e(F1_end(s, e) - F1_start(e))``; the headline is ``mean_s g_s`` with the standard error across
seeds and t on ``seeds - 1`` degrees of freedom (none where the seeds do not differ), an exact sign-flip p over
the seeds, and a 95% interval from a two-level bootstrap over seeds and episodes that also carries the evaluation
set's sampling error. Comparisons between arms are paired by training seed (seed s of two arms shares its
rollout seeds and its start) and by episode: MemOPD against every other arm that ran. A target is a paired
difference, met when it and its bootstrap interval are above 0.

Defaults, sized for ~3 CPU-hours on a 2-core CPU (2 arm processes of 1 thread), and measured at that: the
teacher's SFT 71 CPU-min, the student's 4.5 CPU-min plus probes, the 20 arm runs 96 CPU-min of training
(4.3-5.4 CPU-min each) plus their evaluations, 59 wall-min for the arms in 2 processes (docs/results.md). 5
training seeds are the fewest that give a seed-level t 4 degrees of freedom; 120 updates, not 50: in earlier runs
no gain exceeded its error at 50 updates and MemOPD's grew with updates. The HiMPO arm is not in the default set
(``--arms ... memopd_himpo`` adds it, ~+25 CPU-min): the matched control and GRPO alone are what the claims need.
"""

# Where each part lives (kept out of the docstring above, which is also the command's --help):
# - distill.experiment.config: ExperimentConfig, ModelSpec, the arms (ARMS), the
#   presets (quick_config, pretrained_config) and the check that refuses a rerun with other
#   settings (check_settings);
# - distill.experiment.stages: the stages (teacher, student, one arm, actor timing, diagnostics);
# - distill.experiment.evaluation: the greedy evaluation they share, cached by its key;
# - distill.experiment.report: the results and comparisons tables, the targets, results.md and the
#   learning curves;
# - distill.experiment.run: run_experiment (every stage in order, cached) and the arm runs' worker
#   processes;
# - distill.experiment.cli: memenv experiment memopd (entry point memenv.commands);
# - the statistics (seed-level gains and comparisons, the bootstrap) are distill.stats'.
