"""What a training program needs beside attention: the optimizers (AdamW, host AdamW), resumable training state,
metrics and FLOP counts, the DeepSpeed precision check, the step watchdog, the clean process exit, the
sequence-parallel dataloader and YAML recipes. easy_context/train.py uses them; so can your own loop.
"""
