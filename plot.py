"""Entry point kept at the top level: the plotting CLI lives in easy_context/eval/run_plot.py (installed as
``easy-context-plot``). Same flags, same behaviour."""

from easy_context.eval.run_plot import csv_kind, main, parse_args, ppl_series  # noqa: F401

if __name__ == "__main__":
    main()
