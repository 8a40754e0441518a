"""What only notebook 04_carried_state uses: the text its character model reads, the carried-state lab and
the exercise checks. The tools it teaches live in the core: :func:`backward_twice.steps.carried.find_carried_graph`
and :func:`backward_twice.steps.carried.stamp_iteration` (with ``draw_graph(by_iteration=True)``), and
:func:`helpers.growth.growth_experiment`.
"""

from helpers.lessons.carried_state.checks import check_carried_names, check_precomputed_fix, check_truncated_bptt
from helpers.lessons.carried_state.panel import CarriedLab
from helpers.lessons.carried_state.text import jabberwocky

__all__ = ["CarriedLab", "check_carried_names", "check_precomputed_fix", "check_truncated_bptt", "jabberwocky"]
