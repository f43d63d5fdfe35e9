"""The DRA driver (`baton dra`): GPUs shared through Kubernetes Dynamic Resource Allocation.

Where each decision lives:

- `slices.py`    pure: the node's ResourceSlice (one shareable device per GPU, capacities
                 memory/duty/slots with their request policies, unhealthy GPUs tainted)
- `publisher.py` keeping that slice current after each kubelet registration and health change
- `prepare.py`   a claim's GPUs (pure `claim_gpus`) and the Preparer: CDI spec, then record
- `cdi.py`       the per-claim CDI spec (env, agent socket mount, vendor device)
- `record.py`    prepared claims, kept in a file across restarts
- `runtime.py`   whether the node's container runtime applies CDI
- `service.py`   the kubelet's gRPC services: DRAPlugin v1, DRAResourceHealth, Registration
- `server.py`    their unix sockets (endpoint, plugins_registry)
- `daemon.py`    wiring over `nodegpu`; the command line is `commands/cli/dra.py`

GPU discovery and health (NVML XIDs, the fake GPUs' injected faults on the metrics port) are the
device plugin's (`nodegpu.gpus`, `nodegpu.health`), shared, not copied.
"""
