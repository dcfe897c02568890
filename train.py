"""EasyContext's entry point, kept: the training program lives in easy_context/train.py (installed as
``easy-context-train``; ``accelerate launch -m easy_context.train`` runs the same). Same flags, same behaviour."""

from easy_context.train import (  # noqa: F401  (the names scripts and tests import from train.py)
    backend_options,
    build_parser,
    check_layout,
    cpu_defaults_warning,
    main,
    nonfinite_problem,
    parse_args,
    split_batch,
    to_host,
)
from easy_context.training.process_exit import exit_process

if __name__ == "__main__":
    # after the work: skips only torch's gloo teardown race (easy_context/process_exit.py); 75 after a stop signal
    exit_process(main())
