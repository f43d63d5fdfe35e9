"""The real Prometheus server (Debian's `prometheus`) on loopback, scraping the node's daemons."""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.processes import free_port, get_json, get_ok, poll

BINARY = "prometheus"
MISSING = "needs system package prometheus (apt-get install prometheus): /usr/bin/prometheus"
SCRAPE_INTERVAL_S = 1
RATE_INTERVAL = f"{4 * SCRAPE_INTERVAL_S}s"
"""Grafana's $__rate_interval: max(4 scrape intervals, step + 1 scrape interval), step 1 s."""


def binary() -> str | None:
    """The Prometheus binary on PATH (or Debian's path), None when not installed."""
    found = shutil.which(BINARY)
    if found:
        return found
    debian = Path("/usr/bin/prometheus")
    return str(debian) if os.access(debian, os.X_OK) else None


class Prometheus:
    """A Prometheus server with one job per daemon; TSDB in a temp dir, an ephemeral port."""

    def __init__(self, path: str, workdir: Path, targets: Mapping[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets = dict(targets)
        config = {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
                "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
            },
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [address]}]}
                for job, address in self.targets.items()
            ],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.started_at = time.time()
        self.proc = subprocess.Popen(
            [
                path,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until Prometheus serves and has scraped every target successfully."""
        poll("Prometheus readiness", lambda: get_ok(f"{self.url}/-/ready"), timeout)
        poll("every scrape target up", self._all_up, timeout)

    def _all_up(self) -> bool | None:
        targets = get_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"]
        up = {t["labels"]["job"] for t in targets if t["health"] == "up"}
        return True if up >= set(self.targets) else None

    def wait_scraped_after(self, when: float, timeout: float = 15.0) -> None:
        """Until every target was scraped (successfully) after the Unix time `when`."""

        def scraped() -> bool | None:
            targets = get_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"]
            after = {
                t["labels"]["job"]
                for t in targets
                if t["health"] == "up" and _unix(t["lastScrape"]) > when
            }
            return True if after >= set(self.targets) else None

        poll("a scrape of every target after the run", scraped, timeout)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector; raises with Prometheus's error text."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        answer = get_json(url)
        assert answer["status"] == "success", f"{expr}: {answer}"
        return list(answer["data"]["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's result matrix (what a Grafana time series panel asks for)."""
        params = {"query": expr, "start": start, "end": end, "step": step}
        answer = get_json(f"{self.url}/api/v1/query_range?" + urllib.parse.urlencode(params))
        assert answer["status"] == "success", f"{expr}: {answer}"
        return list(answer["data"]["result"])

    def values_since_start(self, expr: str) -> list[float]:
        """Every finite value a dashboard query took since this server started, evaluated as
        Grafana's time series would (its variables expanded): NaN quantiles (nothing observed)
        are left out."""
        end = time.time()
        seconds = int(end - self.started_at) + 1
        query = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", f"{seconds}s")
        result = self.query_range(query, self.started_at, end, step=SCRAPE_INTERVAL_S)
        values = [float(v[1]) for series in result for v in series["values"]]
        return [v for v in values if math.isfinite(v)]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.log.close()


def _unix(rfc3339: str) -> float:
    """Prometheus's lastScrape (RFC 3339, nanoseconds) as Unix seconds."""
    micro = re.sub(r"(\.\d{6})\d+", r"\1", rfc3339)
    return dt.datetime.fromisoformat(micro).timestamp()
