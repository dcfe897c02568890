"""Long-context evaluation: needle-in-a-haystack retrieval and perplexity vs length, under any SP backend.

The programs :mod:`.run_needle`, :mod:`.run_ppl` and :mod:`.run_plot` (``easy-context-eval-needle``,
``easy-context-eval-ppl``, ``easy-context-plot``; the checkout's ``eval_needle.py``, ``eval_ppl.py`` and
``plot.py`` call them) are thin CLIs over these modules:

* :mod:`.runtime` — process group (1 process or launched), model/tokenizer loading, backend choice, warnings.
* :mod:`.forward` — sequence-parallel no-grad forwards: logits of a few positions, loss sums, greedy decoding.
* :mod:`.tokens` — encoding with the tokenizer's own BOS convention.
* :mod:`.haystack` — the haystack text as sentences with token lengths (repeated when too short).
* :mod:`.needle` — needle/question/prompt construction at a token depth, and the (length, depth) grid.
* :mod:`.scoring` — teacher-forced exact match of the answer tokens, optional greedy generation.
* :mod:`.perplexity` — evaluation documents, windows (truncate / sliding), token-weighted perplexity.
* :mod:`.results` — CSV/JSON writing and reading.
* :mod:`.plots` — the needle heatmap and the perplexity-vs-length plot (matplotlib, Agg).
"""
