"""Single-process tests: math, rules, tables, refusals."""
