"""memenv: Gymnasium environments for long-horizon agents that rewrite their own memory.

    import gymnasium as gym, memenv
    env = gym.make("MemQA-v0")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<memory>...</memory><search>...</search>")
    info["invocation"]   # the exact state snapshot of that invocation
"""

from memenv.registration import register_envs

__version__ = "0.1.0"

register_envs()

__all__ = ["register_envs", "__version__"]
