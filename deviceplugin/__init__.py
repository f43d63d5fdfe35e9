"""The kubelet device plugin: advertises time-sliced GPU slots and hands each pod its GPU.

The node's GPUs, their health, the node annotations and the metrics server are the node layer's
(`nodegpu`); this package keeps what faces the kubelet. Where each decision lives:

- `devices.py`   pure: which pod an Allocate serves, fallback GPUs, GetPreferredAllocation's
                 choice
- `allocation.py` GetPreferredAllocation steers towards the GPUs the extender assigned to the
                 pod most likely admitted; Allocate answers from the device IDs it is given
- `server.py`    the DevicePlugin gRPC service and its unix-socket server
- `registration.py`, `plugin.py`, `watcher.py`  registering with the kubelet, and doing it again
                 when inotify reports a new kubelet.sock or the deletion of our own socket
- `podcache.py`  the watch-fed cache of this node's pods
- `podresources.py`, `truth.py`, `reconcile.py`  the kubelet's PodResources record of what each
                 container got, and pod annotations written from it
- `daemon.py`    wiring over `nodegpu.node.NodeGpus`; the command line is
                 `commands/cli/deviceplugin.py`, the bench `commands/bench/allocate.py`
"""
