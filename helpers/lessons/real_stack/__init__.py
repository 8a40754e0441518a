"""What only notebook 06_real_stack uses: the two-rank DDP runner, the timing of steps side by side, and
the exercise checks.
"""

from helpers.lessons.real_stack.checks import check_ppo_update, check_sam_step
from helpers.lessons.real_stack.ddp import run_ddp
from helpers.lessons.real_stack.timing import best_milliseconds

__all__ = ["best_milliseconds", "check_ppo_update", "check_sam_step", "run_ddp"]
