"""Example tenants that take turns on Baton GPUs."""
