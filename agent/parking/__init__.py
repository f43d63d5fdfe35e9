"""Parking: running the planner's moves through a backend, and the backends themselves."""
