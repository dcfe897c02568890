"""RULER's synthetic long-context tasks under any sequence-parallel backend: easy_context/eval/run_ruler.py (installed
as ``easy-context-eval-ruler``). Same flags, same behaviour."""

from easy_context.eval.run_ruler import main, parse_args  # noqa: F401
from easy_context.training.process_exit import exit_process

if __name__ == "__main__":
    main()
    exit_process()  # after the work: skips only torch's gloo teardown race (easy_context/process_exit.py)
