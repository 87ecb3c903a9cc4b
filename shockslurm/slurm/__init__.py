"""Talking to a real Slurm: building job scripts and sbatch calls, and running them."""
