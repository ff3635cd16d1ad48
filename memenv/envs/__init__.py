"""The environments, one module a family: :mod:`~memenv.envs.memqa` (multi-hop search QA),
:mod:`~memenv.envs.memread` (long-document reading), :mod:`~memenv.envs.memdialog` (long conversations, LoCoMo),
:mod:`~memenv.envs.beam` (BEAM chats), and :mod:`~memenv.envs.base`, what they share."""

from memenv.envs.base import MemEnvBase
from memenv.envs.beam import MemDialogBeamEnv
from memenv.envs.memdialog import MemDialogEnv
from memenv.envs.memqa import MemQAEnv
from memenv.envs.memread import MemReadEnv

__all__ = ["MemDialogBeamEnv", "MemDialogEnv", "MemEnvBase", "MemQAEnv", "MemReadEnv"]
