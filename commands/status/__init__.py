"""`baton status` and `baton events`: what each GPU is doing, on one node or across a cluster."""
