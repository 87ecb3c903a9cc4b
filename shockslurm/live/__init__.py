"""The scheduler that runs on Slurm: the live `engine.Cluster` (`cluster.SlurmCluster`), the
enactment steps it takes (`enact`), the churn bounds (`churn`), stops under way (`stops`), job
specs (`specs`), and the protocols the daemon implements on the store (`journaling`,
`progress_source`). It talks to Slurm through `slurm/` (the adapter) and never imports the
store."""
