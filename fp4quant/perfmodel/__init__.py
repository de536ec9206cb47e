"""Performance model of tensor-parallel training steps: validate on the emulated cluster,
project to H100 clusters (`python -m fp4quant.perfmodel`)."""

from .model import Machine, Step, Workload, allreduce_time, fit_alpha_beta, fit_link, step

__all__ = ["Machine", "Step", "Workload", "allreduce_time", "fit_alpha_beta", "fit_link", "step"]
