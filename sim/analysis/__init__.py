"""Many runs read together: sweeps, the goodput planner, SLOs, reports, plots, the decision guide."""
