"""From raw logs to the paper: tidy CSVs (collect), figures (figures), LaTeX tables (tables).

Used by the workflow (`python -m fp4quant.analysis ...`); every output names the
hardware and the workflow profile that produced the numbers.
"""
