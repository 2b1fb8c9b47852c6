"""Requests to simulate: arrival processes, length distributions, trace readers."""
