"""Recording: what runs while the learner's loop runs (the one place that patches torch, the line tracer, the
loop's passes and iterations, the graphs each backward walked and the names that hold them). It imports only
:mod:`backward_twice.common`."""
