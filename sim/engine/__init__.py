"""The simulated serving system: deployment arithmetic, router, replicas, the cluster run."""
