"""The kubelet device plugin: advertises time-sliced GPU slots and hands each pod its GPU."""
