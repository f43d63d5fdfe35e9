"""The node layer: this node's GPUs, live, under both kubelet-facing daemons.

`deviceplugin` and `dra` each hold one `NodeGpus` (built from `NodeSettings`) and add only what
faces the kubelet; neither imports the other. Where each decision lives:

- `inventory.py` pure: the node's GPUs, their slot devices, health, the annotation records
- `state.py`     the live inventory that health changes replace, with its subscribers
- `gpus.py`      discovery: NVML, or `--fake-gpus 2x81920` / a JSON or YAML file
- `health.py`    XID handling: the NVML event loop (retried with backoff when NVML fails, the
                 GPUs it cannot watch Unhealthy meanwhile); ignored XIDs via `--ignored-xids`
- `annotate.py`  node annotations `baton.dev/gpus` and `baton.dev/host-memory-budget`, put
                 back when a watch of the node shows them lost
- `republish.py` publish at start and after each change, retrying with backoff (the annotator
                 here, the DRA driver's ResourceSlice publisher)
- `metrics.py`   Prometheus metrics and the status server (`/metrics`, `/healthz`, `/readyz`)
- `container.py` what a container given GPUs gets (env, agent socket mount, CDI names)
- `node.py`      `NodeSettings` and `NodeGpus`: all of the above built, started, stopped as one

Fake GPUs fail on request: with `--fake-gpus`, `POST /fake/xid` on the metrics port with
`{"gpu": "<UUID or index>", "xid": 79}` reports an XID as NVML would (ignored XIDs stay ignored)
and `POST /fake/recover` with `{"gpu": ...}` makes the GPU healthy again, e.g.
`curl -d '{"gpu": "0", "xid": 79}' localhost:9461/fake/xid`.
"""
