"""Entry point kept at the top level: the perplexity evaluation lives in easy_context/eval/run_ppl.py (installed as
``easy-context-eval-ppl``). Same flags, same behaviour."""

from easy_context.eval.run_ppl import DEFAULT_DATASET, main, parse_args  # noqa: F401
from easy_context.training.process_exit import exit_process

if __name__ == "__main__":
    main()
    exit_process()  # after the work: skips only torch's gloo teardown race (easy_context/process_exit.py)
