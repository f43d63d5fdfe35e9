"""The cluster coordinator: one turn for a whole job, across its pods and nodes.

A job is the pods that share `baton.dev/job` (llm-d's `timeslice.io/job-id` read as the same);
its turn covers every member pod's GPUs on every node. The coordinator decides whose turn it is
with the agent's own policy core (`agent.core`), and the node agents carry it out: make room and
restore (prepare), then grant (commit), or give the turn back (release), every command fenced by
the leader's epoch. The leader is elected with a `coordination.k8s.io` Lease (`leader.py`).
"""
