"""The node snapshot agent: grants turns on GPUs and parks idle tenants' memory in host DRAM."""
