"""The roof: what people run, standing on the daemons and the contract below.

- `cli/`        the `baton` command (`python -m baton` enters here), one module per group
- `bench/`      every `baton bench` and its same-run reference
- `demo/`       `baton demo`, `baton bench duty` and `baton bench train`
- `localnode/`  a real single Kubernetes node on loopback, and its images
- `status/`     `baton status` and `baton events`
- `kubectl/`    `kubectl baton` (the `kubectl-baton` plugin)

Nothing below imports this package: the daemons, the node layer and the contract never reach
up; only the `baton` entry point does.
"""
