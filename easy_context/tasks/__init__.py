"""The text of long-context tasks, shared by data preparation and evaluation: the haystack (essays), the needle
(a city's magic number), and RULER's synthetic task builders (:mod:`.ruler`). Pure text and token arithmetic: no
model, no process group."""
