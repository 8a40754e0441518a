"""Published training loops retyped at CPU size, each with the truth its probes establish.

Format: FORMAT.md in this folder (one module per loop; TRUTH checked by tests/gallery/test_truth.py).
"""

LOOPS = [
    "wgan_gp_critic",
    "neural_style_lbfgs",
    "seq2seq_global_encoder",
    "two_layer_net_autograd",
    "categorical_built_once",
    "rnn_regressor",
    "rnn_regressor_retain",
    "char_rnn_classification",
    "labels_before_loop",
    "lstm_state_on_module",
    "simple_gan",
    "srgan",
    "srgan_before_fix",
    "cyclegan",
    "wgan_gp_toy",
    "vae_gan",
    "features_before_loop",
    "shared_features_two_heads",
    "total_loss_history",
    "maml",
    "actor_critic",
    "ppo_k_epochs",
    "pcgrad_two_tasks",
]
