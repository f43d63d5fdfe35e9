"""Ways of moving a tenant's GPU memory between device and host (see `base.Backend`)."""
