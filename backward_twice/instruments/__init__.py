"""What a learner wraps around their own code: the saved-tensor meter and the autograd graph drawing. Nothing in
the tool imports them; the drawing loads graphviz, so the front door loads it only when asked."""
