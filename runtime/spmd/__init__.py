"""Running an SPMD plan: its layouts written into the HLO as shardings (`apply`,
`annotate`, `constraints`), then compiled by XLA's partitioner, run, verified and
measured (`runner`)."""
