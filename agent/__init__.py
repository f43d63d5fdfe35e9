"""The node snapshot agent: grants turns on GPUs and parks idle tenants' memory in host DRAM.

`assembly.py` builds the whole agent from one config (`build_agent`; the config: `config.py`),
`daemon.py` starts and stops it; `core` decides, `node` knows the node, `parking` moves memory,
`server` serves the API, `client` is the tenants' library.
"""
