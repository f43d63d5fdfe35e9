"""The kubelet device plugin: advertises time-sliced GPU slots and hands each pod its GPU.

Where each decision lives:

- `devices.py`   pure: slot devices and health, which pod an Allocate serves, fallback GPUs,
                 GetPreferredAllocation's choice, what a container gets (env, mount, CDI names)
- `allocation.py` the Allocator: cache lookup (one list on a miss), annotate, retry on conflict
- `server.py`    the DevicePlugin gRPC service and its unix-socket server
- `registration.py`, `plugin.py`, `watcher.py`  registering with the kubelet, and doing it again
                 when inotify reports a new kubelet.sock or the deletion of our own socket
- `gpus.py`      discovery: NVML, or `--fake-gpus 2x81920` / a JSON or YAML file
- `health.py`    XID handling: the NVML event loop; ignored XIDs via `--ignored-xids`
- `podcache.py`  the watch-fed cache of this node's pods
- `annotate.py`  node annotations `baton.dev/gpus` and `baton.dev/host-memory-budget`
- `metrics.py`   Prometheus metrics and the HTTP server on :9461
- `daemon.py`     wiring; the command line is `baton/cli/deviceplugin.py`, the bench
                 `baton/bench/allocate.py`

Fake GPUs fail on request: with `--fake-gpus`, `POST /fake/xid` on the metrics port with
`{"gpu": "<UUID or index>", "xid": 79}` reports an XID as NVML would (ignored XIDs stay ignored)
and `POST /fake/recover` with `{"gpu": ...}` makes the GPU healthy again, e.g.
`curl -d '{"gpu": "0", "xid": 79}' localhost:9461/fake/xid`.
"""
