"""A learner's step run as written a few times for a tool (the harness), and what is made of it: the carried
graph, the retain audit and :func:`~backward_twice.steps.diagnose.diagnose`, which joins them."""
