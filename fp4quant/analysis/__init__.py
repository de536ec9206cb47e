"""From raw logs to the paper: tidy CSVs (collect), figures (figures), LaTeX tables (tables).

Used by the workflow (`python -m fp4quant.analysis ...`); every output names the
hardware and the workflow profile that produced the numbers.
"""

# The convergence study's figures (not the paper's set); here, where the workflow reads them
# without importing matplotlib or scipy.
STUDY_FIGURES = ("convergence", "tradeoff")
