"""The memenv CLI works where the LLM stack is not installed (the README's main command installs no torch)."""

import subprocess
import sys

SCRIPT = """
import sys
sys.modules['torch'] = None  # importing torch now raises ImportError, as on a machine without it
from memenv.cli import build_parser
sub = next(a for a in build_parser()._actions if a.dest == 'command')
print(sorted(sub.choices))
"""


def test_every_torch_free_command_is_available_without_torch():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    commands = eval(out)  # noqa: S307 - our own printed list
    assert {"play", "bench", "index"} <= set(commands)
    assert {"train", "distill"} <= set(commands)  # listed; they say what is missing when run


RUN = """
import sys
sys.modules['torch'] = None
from memenv.cli import main
sys.exit(main(['distill', '--teacher', 'nowhere']))
"""


def test_a_command_that_needs_the_llm_stack_says_how_to_install_it():
    done = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("memenv distill: error: needs torch")
    assert "pip install -e '.[llm]'" in done.stderr
