"""Cluster and sweep YAML shipped with rhino (configs/clusters, configs/sweeps)."""
