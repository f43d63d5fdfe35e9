"""Files that are no kubeconfig, and the words the one-line refusal of each must hold (the
daemons' `load_api_client` and `kubectl baton` refuse them alike)."""

NOT_KUBECONFIGS = [
    (b"clusters: [\n", "not YAML: expected the node content, but found '<stream end>'"),
    (b"just a word\n", "not shaped as a kubeconfig's (TypeError"),
    (b"- a\n- list\n", "not shaped as a kubeconfig's (TypeError"),
    (b"clusters: 5\n", "not shaped as a kubeconfig's (TypeError"),
    (b"\x7fELF\xd0\x02", "not YAML: 'utf-8' codec can't decode"),
]
