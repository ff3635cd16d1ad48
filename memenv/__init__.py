"""memenv: Gymnasium environments for long-horizon agents that rewrite their own memory.

    import gymnasium as gym, memenv
    env = gym.make("MemQA-v0")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<memory>...</memory><search>...</search>")
    info["invocation"]   # the exact state snapshot of that invocation
"""

from memenv.packages import PackageClashError, check_packages

# The envs import memenv's top-level ``tasks``: another one first on the path (a tasks.py or tasks/ folder of
# the user's, another distribution's) is one line here rather than a missing module deep in an env.
check_packages(("tasks",))

from memenv.registration import register_envs  # noqa: E402 - after the check

__version__ = "0.1.0"

register_envs()


def _check_agents_package() -> None:
    """Raise :class:`~memenv.packages.PackageClashError`, one line naming it and what to do, when ``import
    agents`` gives another distribution's package (openai-agents installs a top-level ``agents`` too) rather
    than memenv's; code of memenv that imports ``agents`` calls this first."""
    check_packages(("agents", "distill"))


__all__ = ["PackageClashError", "register_envs", "__version__"]
