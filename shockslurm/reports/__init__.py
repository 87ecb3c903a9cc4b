"""Training reports on the daemon's side: the spool ingest (`ingest`), its safe file reads
(`spool_read`) and the daemon-owned area for refused reports (`rejected`).

The job's side (how a training job writes reports) stays in `shockslurm.train.reports`; the
report schema and signatures in `shockslurm.train.records`. Nothing here imports torch.
"""
