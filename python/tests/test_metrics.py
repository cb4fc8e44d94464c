"""`ftlab serve --metrics`: scraped over HTTP and parsed by Prometheus's own Python parser
(prometheus_client), after real I/O from qemu-io; with a policy, only if it allows metrics."""

import shutil
import subprocess
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ftlab_binary

# qemu-utils is on every machine the tests run on (README): no skip.
assert shutil.which("qemu-io"), "qemu-io (qemu-utils) is needed"


def serve(tmp_path, *extra):
    sock = tmp_path / "nbd.sock"
    proc = subprocess.Popen(
        [ftlab_binary(), "serve", "--no-tcp", "--unix", str(sock), "--set", "capacity.logical_bytes=67108864",
         "--set", "flash.blocks_per_die=32", "--metrics", "127.0.0.1:0", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    url = None
    for line in proc.stderr:
        if "metrics on " in line:
            url = line.split("metrics on ")[1].strip()
        if "export `" in line:
            break
    assert url, "the server said where its metrics are"
    return proc, f"nbd+unix:///?socket={sock}", url


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def value(family, **labels):
    return next(s.value for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_parse_and_count_what_clients_did(tmp_path):
    proc, uri, url = serve(tmp_path)
    try:
        subprocess.run(["qemu-io", "-f", "raw", "-c", "write 0 1M", "-c", "read 0 4k", uri], check=True, capture_output=True)
        m = scrape(url)
        assert m["ftlab_waf"].type == "gauge" and value(m["ftlab_waf"]) == 1.0
        assert value(m["ftlab_host_write_pages"]) == 256  # 1 MiB of 4 KiB pages
        assert value(m["ftlab_flash_program_pages"], cause="host") == 256
        assert value(m["ftlab_flash_program_pages"], cause="gc_user") == 0
        h = m["ftlab_nbd_request_duration_seconds"]
        assert h.type == "histogram"
        writes = value(h, op="write", le="+Inf")
        assert writes >= 1
        assert [s.name for s in h.samples if s.labels.get("op") == "write"][-1] == "ftlab_nbd_request_duration_seconds_count"
        # Buckets are cumulative.
        buckets = [s.value for s in h.samples if s.name.endswith("_bucket") and s.labels["op"] == "write"]
        assert buckets == sorted(buckets) and buckets[-1] == writes
        assert value(m["ftlab_connections"]) >= 1
        assert value(m["ftlab_store_orig_data_size"]) == 1 << 20
        assert value(m["ftlab_policy_denied"]) == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_policy_decides_who_reads_the_metrics(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[[statement]]\neffect = "allow"\nprincipals = ["*"]\nactions = ["read"]\nexports = ["*"]\n')
    proc, _, url = serve(tmp_path, "--policy", str(policy))
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(url)
        assert refused.value.code == 403
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    policy.write_text('[[statement]]\neffect = "allow"\nprincipals = ["anonymous"]\nactions = ["metrics"]\nexports = ["*"]\n')
    proc, _, url = serve(tmp_path, "--policy", str(policy))
    try:
        assert value(scrape(url)["ftlab_policy_denied"]) == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
