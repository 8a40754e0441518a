"""What only one notebook uses, one module (or small package) per notebook.

``graph_buffers`` (notebook 01), ``multi_loss`` (02), ``gan_step`` (03), ``carried_state`` (04),
``your_training_step`` (05) and ``real_stack`` (06) hold each notebook's exercise checks, panels, data and
experiments. A lesson imports the core modules of ``helpers`` and never another lesson; a helper moves into the
core when a second notebook needs it.
"""
