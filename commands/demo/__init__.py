"""`baton demo` and `baton bench duty`: RL tenants alone on their GPUs, then sharing one."""
