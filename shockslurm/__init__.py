"""shockslurm: the Shockwave scheduler for dynamic-adaptation ML jobs, simulated and on Slurm."""

__version__ = "0.1.0"
