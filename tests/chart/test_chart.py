"""The chart as Helm itself checks it: `helm lint --strict`, `helm template` of every documented
values set, the schema refusing bad values by name, and the choices made from capabilities."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART, NAMESPACE, helm, refused, render

VALUES_SETS = sorted((CHART / "ci").glob("*-values.yaml"))


def kinds(objs: list[dict]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for obj in objs:
        found.setdefault(obj["kind"], set()).add(obj["metadata"]["name"])
    return found


@pytest.mark.parametrize("values", [None, *VALUES_SETS], ids=lambda p: p.name if p else "default")
def test_lint_strict(values: Path | None) -> None:
    args = ["-f", str(values)] if values else []
    done = helm("lint", "--strict", str(CHART), *args)
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("agent.queuePolicy=roundrobin", "/agent/queuePolicy"),
        ("gpu.backend=amd", "/gpu/backend"),
        ("kubeletPlugin=cdi", "/kubeletPlugin"),
        ("agent.parking={cuda,swap}", "/agent/parking/1"),
        ("agent.fairness.minShare=lots", "/agent/fairness/minShare"),
        # --set gives a decimal as a string: the range holds for it too
        ("agent.fairness.minShare=0.9", "/agent/fairness/minShare"),
        ("agent.fairness.creditSeconds=-0.5", "/agent/fairness/creditSeconds"),
        ("agent.maxHoldSeconds=-0.5", "/agent/maxHoldSeconds"),
        ("agent.maxHoldSeconds=0", "/agent/maxHoldSeconds"),
        ("agent.forgetDepartedAfterSeconds=-1", "/agent/forgetDepartedAfterSeconds"),
        ("agent.forgetDepartedAfterSeconds=never", "/agent/forgetDepartedAfterSeconds"),
        ("hostMemoryBudgetMiB=-1", "/hostMemoryBudgetMiB"),
        ("extender.policy=random", "/extender/policy"),
        ("gpu.simulated.gpus=two", "/gpu/simulated/gpus"),
        # the agent refuses a scale of 0 at start (real bytes per simulated byte, above 0)
        ("gpu.simulated.scale=0", "/gpu/simulated/scale"),
        ("gpu.simulated.scale=0.000", "/gpu/simulated/scale"),
        ("agent.llmd.listen=50051", "/agent/llmd/listen"),
        ("agent.llmd.forgetIdleAfterSeconds=-1", "/agent/llmd/forgetIdleAfterSeconds"),
        ("agent.llmd.listen=0.0.0.0:70000", "agent.llmd.listen 0.0.0.0:70000: the port must be 1-"),
        ("agent.llmd.listen=0.0.0.0:0", "agent.llmd.listen 0.0.0.0:0: the port must be 1-65535"),
        ("agent.queuepolicy=fair", "queuepolicy"),
        # a tag or digest in the repository: the pods' image would be `reg/baton:0.2.0:0.1.0`
        ("image.repository=reg/baton:0.2.0", "/image/repository"),
        ("image.repository=localhost:5000/baton:dev", "/image/repository"),
        ("image.repository=reg/baton@sha256:0123", "/image/repository"),
        ("image.repository=[fd00::1]:5000/baton:dev", "/image/repository"),
        ("image.repository=[fd00::1]:5000", "/image/repository"),
        ("image.repository=[fd00::zz]/baton", "/image/repository"),
        ("schedulerImage.repository=registry.k8s.io/kube-scheduler:v1.36.2", "/schedulerImage"),
    ],
)
def test_schema_refuses_a_bad_value_naming_it(setting: str, named: str) -> None:
    said = refused("--set", setting)
    assert named in said, said


def test_schema_takes_the_documented_settings() -> None:
    settings = [
        "agent.queuePolicy=fair",
        "agent.fairness.minShare=0.5",
        "agent.fairness.tierGraceSeconds=5",
        "agent.maxHoldSeconds=30.0",
        "agent.forgetDepartedAfterSeconds=0",
        "agent.parking={cuda,app}",
        "hostMemoryBudgetMiB=262144",
        "agent.llmd.listen=0.0.0.0:50051",
        "agent.llmd.forgetIdleAfterSeconds=600",
        "extender.policy=spread",
    ]
    objs = render(*[arg for s in settings for arg in ("--set", s)])
    (agent,) = [
        o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "baton-agent"
    ]
    env = {
        e["name"]: e.get("value") for e in agent["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["BATON_AGENT_QUEUE_POLICY"] == "fair"
    assert env["BATON_AGENT_FAIR_MIN_SHARE"] == "0.5"  # the range's ends are in it
    assert env["BATON_AGENT_MAX_HOLD"] == "30.0"
    assert env["BATON_AGENT_FORGET_DEPARTED_AFTER"] == "0"  # 0 is a choice: never fold
    assert env["BATON_AGENT_TIER_GRACE"] == "5"
    assert env["BATON_AGENT_BACKEND"] == "cuda,app"
    assert env["BATON_HOST_MEMORY_BUDGET"] == "262144"
    assert env["BATON_AGENT_LLMD_LISTEN"] == "0.0.0.0:50051"
    assert env["BATON_AGENT_LLMD_FORGET_IDLE_AFTER"] == "600"


DRA_CLUSTER = ("--api-versions", "resource.k8s.io/v1", "--kube-version", "1.36.2")
"""A cluster `auto` takes the DRA path on (Helm's offline default speaks 1.35)."""


def test_auto_takes_the_dra_path_where_the_api_serves_it_with_consumable_capacity() -> None:
    """DRA's API is served from 1.34, but kube-scheduler allocates Baton's claims (consumable
    capacity, baton.dev/gpu mapped) by default only from 1.36: before, the device plugin."""
    found = kinds(render(*DRA_CLUSTER))
    assert "baton-dra" in found["DaemonSet"] and "baton-deviceplugin" not in found["DaemonSet"]
    assert found["DeviceClass"] == {"gpu.baton.dev"}
    for older in ("1.34.0", "1.35.3"):
        served = kinds(render("--api-versions", "resource.k8s.io/v1", "--kube-version", older))
        assert "baton-deviceplugin" in served["DaemonSet"] and "DeviceClass" not in served
    pinned = kinds(render("--set", "kubeletPlugin=deviceplugin"))
    assert "baton-deviceplugin" in pinned["DaemonSet"] and "DeviceClass" not in pinned


def test_monitors_only_where_the_operator_crds_are_served() -> None:
    assert "ServiceMonitor" not in kinds(render())
    found = kinds(render("--api-versions", "monitoring.coreos.com/v1"))
    assert found["ServiceMonitor"] == {"baton-extender"}
    assert found["PodMonitor"] == {"baton-agent", "baton-deviceplugin", "baton-coordinator"}
    found = kinds(render("--api-versions", "monitoring.coreos.com/v1", *DRA_CLUSTER))
    assert found["PodMonitor"] == {"baton-agent", "baton-dra", "baton-coordinator"}
    dashboard = [o for o in render() if o["metadata"]["name"] == "baton-grafana-dashboard"]
    assert dashboard[0]["metadata"]["labels"]["grafana_dashboard"] == "1"


@pytest.mark.parametrize(
    "setting",
    ["monitoring.dashboard.labels.grafana_dashboard=null", "monitoring.dashboard.labels=null"],
)
def test_the_dashboard_renders_without_the_default_sidecar_label(setting: str) -> None:
    """A Grafana whose sidecar looks for another label: the default one taken away (null), the
    ConfigMap still renders, with the chart's own labels."""
    (dashboard,) = [
        o for o in render("--set", setting) if o["metadata"]["name"] == "baton-grafana-dashboard"
    ]
    assert "grafana_dashboard" not in dashboard["metadata"]["labels"]
    assert dashboard["metadata"]["labels"]["app.kubernetes.io/part-of"] == "baton"


def test_helm_test_pod_asks_for_a_turn() -> None:
    (pod,) = [o for o in render() if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["schedulerName"] == "baton-scheduler"
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {"baton.dev/gpu": 1}
    assert "acquire" in container["command"][-1] and "yield_" in container["command"][-1]


def test_the_parking_values_are_the_methods_a_node_parks_any_tenant_with() -> None:
    """`agent.parking` offers every method of the agent's table that parks a plain tenant
    (`agent.parking.methods.PLAIN` but `none`, which the empty list stands for): a new method
    shows up here or this fails."""
    import json

    from agent.parking.methods import NONE, PLAIN

    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["agent"]["properties"]["parking"]["items"]["enum"]
    assert sorted(enum) == sorted(m for m in PLAIN if m != NONE)


def scheduler_image(objs: list[dict]) -> str:
    (deployment,) = [o for o in objs if o["metadata"]["name"] == "baton-scheduler" and "spec" in o]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return str(container["image"])


def test_a_registry_with_a_port_is_a_repository() -> None:
    mine = ["--set", "image.repository=localhost:5000/team/baton"]
    mine += ["--set", "schedulerImage.repository=localhost:5000/kube-scheduler"]
    objs = render("--kube-version", "1.33.4", *mine)
    assert node_env(objs, "baton-agent")  # rendered
    (agent,) = [o for o in objs if o["metadata"]["name"] == "baton-agent" and "spec" in o]
    image = agent["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "localhost:5000/team/baton:0.1.0"
    assert scheduler_image(objs) == "localhost:5000/kube-scheduler:v1.33.4"


@pytest.mark.parametrize("registry", ["[fd00::1]:5000", "[fd00::1]", "[::1]:5000"])
def test_an_ipv6_literal_registry_is_a_repository(registry: str) -> None:
    """An image reference's registry may be a bracketed IPv6 address, with or without a port."""
    mine = ["--set", f"image.repository={registry}/team/baton", "--kube-version", "1.33.4"]
    mine += ["--set", f"schedulerImage.repository={registry}/kube-scheduler"]
    objs = render(*mine)
    (agent,) = [o for o in objs if o["metadata"]["name"] == "baton-agent" and "spec" in o]
    image = agent["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"{registry}/team/baton:0.1.0"
    assert scheduler_image(objs) == f"{registry}/kube-scheduler:v1.33.4"


def test_the_dra_path_runs_a_kube_scheduler_that_allocates_its_claims() -> None:
    """On the DRA path kube-scheduler allocates the claims (consumable capacity, baton.dev/gpu
    mapped by the DeviceClass): that takes 1.36; the device plugin's path takes the API server's."""
    dra = scheduler_image(render("--kube-version", "1.35.0", "--set", "kubeletPlugin=dra"))
    assert dra == "registry.k8s.io/kube-scheduler:v1.36.2"
    assert scheduler_image(render(*DRA_CLUSTER)) == dra
    plugin = scheduler_image(
        render("--kube-version", "1.35.3", "--set", "kubeletPlugin=deviceplugin")
    )
    assert plugin == "registry.k8s.io/kube-scheduler:v1.35.3"
    mine = ["--set", "schedulerImage.repository=mirror/ks", "--set", "schedulerImage.tag=local"]
    assert scheduler_image(render(*DRA_CLUSTER, *mine)) == "mirror/ks:local"


@pytest.mark.parametrize(
    ("server", "tag"),
    [
        ("1.29.3", "v1.29.3"),
        ("v1.31.0", "v1.31.0"),
        ("1.30.5-eks-ce1d5eb", "v1.30.5"),
        ("v1.30.14+k3s1", "v1.30.14"),
        ("1.32.0", "v1.32.0"),
        ("1.33.4", "v1.33.4"),
        ("1.34.1", "v1.34.1"),
        ("1.35.0", "v1.35.0"),
        ("1.36.0", "v1.36.0"),
        ("1.37.2-gke.100", "v1.37.2"),
    ],
)
def test_the_default_kube_scheduler_is_never_newer_than_the_api_server(
    server: str, tag: str
) -> None:
    """kube-scheduler may be neither newer than its API server nor more than one minor older
    (version-skew policy), and the chart takes servers from 1.29: the device plugin's path gets
    the API server's own version's kube-scheduler."""
    objs = render("--kube-version", server, "--set", "kubeletPlugin=deviceplugin")
    assert scheduler_image(objs) == f"registry.k8s.io/kube-scheduler:{tag}"
    mine = render(
        "--kube-version", server, "--set", "kubeletPlugin=deviceplugin",
        "--set", "schedulerImage.tag=v1.29.0",
    )  # fmt: skip
    assert scheduler_image(mine) == "registry.k8s.io/kube-scheduler:v1.29.0"


@pytest.mark.parametrize(
    ("server", "tag"), [("1.36.0", "v1.36.0"), ("1.36.2", "v1.36.2"), ("1.38.1", "v1.38.1")]
)
def test_the_dra_path_takes_the_api_servers_own_kube_scheduler_from_1_36(
    server: str, tag: str
) -> None:
    """On the DRA path too a newer API server gets its own version, never a kube-scheduler two
    minors older; an older one (kubeletPlugin=dra forced) keeps v1.36.2, the least that allocates
    the claims."""
    objs = render("--api-versions", "resource.k8s.io/v1", "--kube-version", server)
    assert scheduler_image(objs) == f"registry.k8s.io/kube-scheduler:{tag}"
    forced = render("--kube-version", "1.35.2", "--set", "kubeletPlugin=dra")
    assert scheduler_image(forced) == "registry.k8s.io/kube-scheduler:v1.36.2"


@pytest.mark.parametrize("tag", ["v1.32.2", "1.35.4", "v1.35.0-gke.1"])
def test_an_older_kube_scheduler_on_the_dra_path_is_refused_naming_the_tag(tag: str) -> None:
    said = refused("--set", "kubeletPlugin=dra", "--set", f"schedulerImage.tag={tag}")
    assert f"schedulerImage.tag {tag}: the DRA path (kubeletPlugin dra) needs" in said, said
    assert "1.36 or later" in said
    older = render("--set", "kubeletPlugin=deviceplugin", "--set", f"schedulerImage.tag={tag}")
    assert scheduler_image(older).endswith(f":{tag}")


def node_env(objs: list[dict], name: str) -> dict[str, str]:
    (daemonset,) = [o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == name]
    return {
        e["name"]: e.get("value")
        for e in daemonset["spec"]["template"]["spec"]["containers"][0]["env"]
    }


@pytest.mark.parametrize("runtime_class", ["", "nvidia"])
def test_cdi_names_the_gpus_on_either_path_with_or_without_a_runtime_class(
    runtime_class: str,
) -> None:
    cdi = ["--set", "gpu.nvidia.cdi=true", "--set", f"gpu.nvidia.runtimeClassName={runtime_class}"]
    plugin = node_env(render("--set", "kubeletPlugin=deviceplugin", *cdi), "baton-deviceplugin")
    assert plugin["BATON_CDI"] == "true"
    driver = node_env(render("--set", "kubeletPlugin=dra", *cdi), "baton-dra")
    assert driver["BATON_VENDOR_CDI"] == "nvidia.com/gpu"
    assert "BATON_VENDOR_CDI" not in node_env(render("--set", "kubeletPlugin=dra"), "baton-dra")


@pytest.mark.parametrize(
    "spec",
    [
        *("2x81920", "81920,40960", " 3 x 1024 ", "0x81920", "2x0", "81920,0", "0", "007x0"),
        # more GPUs than a node declares (64), often the count and size swapped
        *("64x1", "0064x1", "65x1024", "81920x2", "100000000000000000000x1"),
        *(",".join(["1024"] * n) for n in (64, 65)),
    ],
    ids=lambda spec: spec if len(spec) < 30 else f"list of {spec.count(',') + 1}",
)
def test_the_schema_takes_the_simulated_gpus_the_daemons_take(spec: str, tmp_path: Path) -> None:
    """`gpu.simulated.gpus` is parsed at start by the agent, the device plugin and the DRA driver
    (`fake_gpu_sizes`): one they refuse (no GPU, a GPU of 0 MiB, more than 64 GPUs) would leave
    every node daemon crash-looping, so the chart refuses it first, naming the value."""
    from baton.contract.names import fake_gpu_sizes

    values = tmp_path / "values.yaml"
    simulated = {"backend": "simulated", "simulated": {"gpus": spec}}
    values.write_text(yaml.safe_dump({"gpu": simulated}))
    try:
        fake_gpu_sizes(spec)
    except ValueError:
        said = refused("-f", str(values))
        assert "/gpu/simulated/gpus" in said or f"gpu.simulated.gpus {spec}:" in said, said
    else:
        env = node_env(render("-f", str(values)), "baton-deviceplugin")
        assert env["BATON_FAKE_GPUS"] == spec


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (
            ["agent.parking={fake}"],
            "agent.parking fake parks simulated GPUs' memory: set gpu.backend=simulated",
        ),
        (
            ["agent.parking={app,fake}"],
            "agent.parking fake parks simulated GPUs' memory: set gpu.backend=simulated",
        ),
        (
            ["gpu.backend=simulated", "agent.parking={cuda}"],
            "agent.parking cuda checkpoints real CUDA processes: set gpu.backend=nvidia",
        ),
    ],
)
def test_a_parking_method_of_the_other_gpu_backend_is_refused(
    settings: list[str], said: str
) -> None:
    """`fake` moves the files simulated tenants write (a CUDA tenant's memory would stay on the
    GPU while the next one is granted), over simulated GPUs the device plugin does not
    advertise; `cuda` needs NVIDIA's driver and the privileged agent, which the simulated
    backend does not run."""
    stderr = refused(*[arg for s in settings for arg in ("--set", s)])
    assert said in stderr, stderr
    for kept in (
        ["agent.parking={cuda,app}"],
        ["gpu.backend=simulated", "agent.parking={fake,app}"],
    ):
        render(*[arg for s in kept for arg in ("--set", s)])


@pytest.mark.parametrize(
    "memory_dir", ["/run/baton", "/run/baton/", "/var/lib/baton", "/etc/baton/coordination"]
)
def test_a_simulated_memory_dir_the_agent_mounts_already_is_refused(memory_dir: str) -> None:
    """Two volumes at one path in the agent: the API server refuses its pods, and the chart
    said nothing."""
    stderr = refused(
        "--set", "gpu.backend=simulated", "--set", f"gpu.simulated.memoryDir={memory_dir}"
    )
    assert f"gpu.simulated.memoryDir {memory_dir}: the chart already mounts" in stderr, stderr


@pytest.mark.parametrize(
    "memory_dir", ["/run/baton-fake-gpus", "/run/baton/fake-gpus", "/dev/shm/x"]
)
def test_a_simulated_memory_dir_mounts_once(memory_dir: str) -> None:
    objs = render(
        "--set", "gpu.backend=simulated", "--set", f"gpu.simulated.memoryDir={memory_dir}"
    )
    (agent,) = [
        o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "baton-agent"
    ]
    paths = [
        m["mountPath"] for m in agent["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    ]
    assert len(paths) == len(set(paths)), paths


@pytest.mark.parametrize("plugin", ["deviceplugin", "dra"])
def test_host_network_pods_resolve_the_services_they_dial(plugin: str) -> None:
    """A host-network pod under dnsPolicy Default (or ClusterFirst, which the kubelet turns into
    Default for it) reads the node's resolv.conf and cannot resolve a Service's name: without a
    listen host the agents dial baton-coordinator.<ns>.svc and kube-scheduler calls
    baton-extender.<ns>.svc. ClusterFirstWithHostNet resolves them through cluster DNS (a kubelet
    with no cluster DNS falls back to the node's resolv.conf)."""
    objs = render("--set", "hostNetwork.enabled=true", "--set", f"kubeletPlugin={plugin}")
    pods = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] in ("DaemonSet", "Deployment")
    }
    assert set(pods) >= {"baton-agent", "baton-scheduler", "baton-coordinator", "baton-extender"}
    for name, spec in pods.items():
        assert spec.get("hostNetwork") is True, name
        assert spec.get("dnsPolicy") == "ClusterFirstWithHostNet", name
    address = node_env(objs, "baton-agent")["BATON_COORDINATOR"]
    assert address == f"baton-coordinator.{NAMESPACE}.svc:50051"
