"""Step time: the cost-model interface, the roofline prior, calibrated profiles."""
