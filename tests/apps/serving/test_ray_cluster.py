"""``transformer-kit serve --ray`` on a Ray cluster of two machines: two network namespaces of this
machine joined by a veth pair, the head at 10.231.0.1 and a worker at 10.231.0.2, each a Ray node
of one CPU (so one replica on each), made by the test and removed after (root only: skipped with
a sentence where ``ip netns add`` is refused). The server runs in the head's namespace with
``RAY_ADDRESS`` naming the head and ``--host 10.231.0.1``: a replica on each node; 64 requests, 16
at a time, through the head's proxy reach both replicas and get ``OnnxModel.generate``'s tokens;
the worker's proxy answers on 10.231.0.2 too; the worker losing its link ends the stream its
replica was sending with an error, not a hang; SIGTERM stops the server and leaves no replica.
The requests are sent from inside the head's namespace (tests/apps/serving/ray_cluster_client.py),
which the test process cannot reach."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.apps.serving.test_http import _alone
from tests.apps.serving.test_ray import KEY, _cases, _long_prompt, _until
from tests.chat.checkpoint import write_chat_checkpoint

HEAD_IP, WORKER_IP = "10.231.0.1", "10.231.0.2"
GCS_PORT, HTTP_PORT = 6379, 8000  # each namespace has ports of its own: these are free there
#: The repository root (for PYTHONPATH) and the environment's programs (ray, transformer-kit).
ROOT, BIN = Path(__file__).resolve().parents[3], Path(sys.executable).parent
#: The longest a step waits (a request, the end of a stream, the server's end).
WAIT_S = 120
#: The longest a start waits (a Ray node's, the server's: 2 replicas and 2 proxies): up to 110 s
#: measured beside two CPU-bound processes on 2 cores.
START_S = 240


def _environment() -> dict[str, str]:
    """The test process's environment for the hosts' processes: its programs first on PATH, this
    checkout first on PYTHONPATH, no RAY_ADDRESS of its own, Ray without a token (the cluster
    lives inside this machine's namespaces)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "/usr/bin:/bin")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    # Ray Serve gives a proxy 5 s to get ready and 10 s per health check; on a loaded 2-core machine
    # it can take longer (measured: the proxy killed before it ran, and serve.start failed)
    env.update(RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S="120", RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S="120")
    return env


@dataclass
class Host:
    """A network namespace with one end of the veth pair."""

    namespace: str
    ip: str
    link: str

    def command(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *args]

    def run(self, *args: str, timeout: float = START_S, stdin: str | None = None,
            env: dict[str, str] | None = None) -> str:
        """The command's stdout; fails with its output where it fails or runs past ``timeout``."""
        try:
            done = subprocess.run(self.command(*args), input=stdin, capture_output=True, text=True,
                                  timeout=timeout, env=env or _environment(), cwd=ROOT, check=False)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"not within {timeout} s: {' '.join(args)} in {self.namespace}\n{exc.stdout}"
                        f"\n{exc.stderr}")
        assert done.returncode == 0, f"{' '.join(args)} in {self.namespace}: {done.stderr[-4000:]}"
        return done.stdout

    def client(self, *args: str, stdin: str | None = None) -> object:
        """The JSON that ray_cluster_client.py answers, run in this host."""
        out = self.run(sys.executable, "-m", "tests.apps.serving.ray_cluster_client", *args,
                       stdin=stdin)
        return json.loads(out.splitlines()[-1])

    def pids(self) -> set[int]:
        """The live processes in this host (zombies, ended but not yet reaped, left out)."""
        listed = subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True,
                                text=True, check=False)
        return {int(pid) for pid in listed.stdout.split() if not _zombie(int(pid))}

    def programs(self) -> list[str]:
        """The command lines of the processes in this host."""
        found = []
        for pid in self.pids():
            try:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
        return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in "ZX"
    except (OSError, IndexError):
        return True  # gone


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _end_processes(hosts: list[Host]) -> None:
    """SIGTERM to every process in the hosts, SIGKILL to those left after 10 s."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        for host in hosts:
            for pid in host.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while any(host.pids() for host in hosts) and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[Host, Host]]:
    """(head, worker): two network namespaces joined by a veth pair, loopback up in each; at the
    end every process in them is ended and they are removed."""
    if shutil.which("ip") is None:
        pytest.skip("two hosts on one machine need iproute2's ip (network namespaces), not found")
    tag = f"tk{os.getpid()}"
    head, worker = Host(f"{tag}-head", HEAD_IP, "veth-head"), Host(f"{tag}-worker", WORKER_IP, "veth-worker")
    made = []
    try:
        for host in (head, worker):
            added = _ip("netns", "add", host.namespace)
            if added.returncode != 0:
                pytest.skip(f"two hosts on one machine need network namespaces, and 'ip netns add' was "
                            f"refused (needs root): {added.stderr.strip()}")
            made.append(host)
        steps = [("-n", head.namespace, "link", "add", head.link, "type", "veth", "peer", "name",
                  worker.link, "netns", worker.namespace)]
        for host in (head, worker):
            steps += [("-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", host.link),
                      ("-n", host.namespace, "link", "set", "lo", "up"),
                      ("-n", host.namespace, "link", "set", host.link, "up")]
        for step in steps:
            result = _ip(*step)
            assert result.returncode == 0, f"ip {' '.join(step)}: {result.stderr}"
        yield head, worker
    finally:
        _end_processes(made)
        for host in made:
            _ip("netns", "del", host.namespace)


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory) -> Iterator[tuple[Host, Host]]:
    """A Ray head (one CPU, no dashboard) in the first host and a worker (one CPU) in the second,
    each with a temporary folder of its own; both nodes alive."""
    head, worker = hosts
    # a short path: Ray's sockets live under it, and a Unix socket's path has at most 107 bytes
    temp = Path(tempfile.mkdtemp(prefix="tk-ray-"))
    try:
        # the head's GCS takes a node for dead after 5 failed health checks, each of at most 10 s
        # 3 s apart by default (measured here: 65 s from the link's loss to the stream's end); 2 s
        # 1 s apart on these two namespaces of one machine
        env = {**_environment(), "RAY_health_check_timeout_ms": "2000", "RAY_health_check_period_ms": "1000"}
        head.run("ray", "start", "--head", "--node-ip-address", HEAD_IP, "--port", str(GCS_PORT),
                 "--num-cpus", "1", "--include-dashboard=false", "--disable-usage-stats",
                 "--temp-dir", str(temp / "head"), env=env)
        worker.run("ray", "start", "--address", f"{HEAD_IP}:{GCS_PORT}", "--node-ip-address", WORKER_IP,
                   "--num-cpus", "1", "--disable-usage-stats", "--temp-dir", str(temp / "worker"))
        yield head, worker
    finally:
        _end_processes(list(hosts))
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory):
    """(export folder, its OnnxModel): a chat checkpoint's export, as in test_ray.py (a context of
    1024 tokens, for a long stream)."""
    import transformer_kit as tk
    from transformer_kit.export import export_onnx
    from transformer_kit.runtime import OnnxModel

    folder = write_chat_checkpoint(tmp_path_factory.mktemp("ray-cluster") / "qwen2")
    export_onnx(tk.from_hf(folder), folder / "onnx")
    return folder / "onnx", OnnxModel(folder / "onnx", providers="cpu")


@dataclass
class Served:
    head: Host
    worker: Host
    process: subprocess.Popen
    log: Path

    def url(self, host: Host) -> str:
        return f"http://{host.ip}:{HTTP_PORT}"

    def replicas(self) -> dict[str, dict]:
        return self.head.client("replicas", f"{HEAD_IP}:{GCS_PORT}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


@pytest.fixture(scope="module")
def served(cluster, chat_export, tmp_path_factory) -> Iterator[Served]:
    """``transformer-kit serve EXPORT --ray --replicas 2 --host 10.231.0.1`` in the head's
    namespace, RAY_ADDRESS naming the head, until /health answers through the head's proxy."""
    head, worker = cluster
    folder, _ = chat_export
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**_environment(), "RAY_ADDRESS": f"{HEAD_IP}:{GCS_PORT}"}
    with log.open("w") as out:
        process = subprocess.Popen(head.command(
            "transformer-kit", "serve", str(folder), "--ray", "--replicas", "2", "--host", HEAD_IP,
            "--port", str(HTTP_PORT), "--provider", "cpu", "--model-name", "tiny", "--api-key", KEY),
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    app = Served(head, worker, process, log)
    try:
        _until(lambda: "serving 'tiny' on Ray Serve" in app.output() or process.poll() is not None,
               "the server says it serves", START_S)
        assert process.poll() is None, f"the server ended ({process.returncode}):\n{app.output()}"
        yield app
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def test_a_replica_on_each_node_and_both_serve_exactly_through_the_head(served, chat_export):
    _, onnx_model = chat_export
    replicas = served.replicas()
    assert sorted(r["ip"] for r in replicas.values() if r["state"] == "ALIVE") == [HEAD_IP, WORKER_IP], \
        replicas
    cases = [(prompt, new, i % 2 == 1) for i, (prompt, new) in enumerate(_cases(7, 64))]
    answers = served.head.client("ask", served.url(served.head), KEY, "16", stdin=json.dumps(cases))
    for (prompt, new, _), answer in zip(cases, answers, strict=True):
        assert answer["status"] == 200 and answer["tokens"] == _alone(onnx_model, prompt, new), answer
    by_replica = Counter(a["replica"] for a in answers)
    assert set(by_replica) == set(replicas), f"both replicas answer through the head: {by_replica}"


def test_the_worker_s_proxy_answers_too(served, chat_export):
    _, onnx_model = chat_export
    cases = [(prompt, new, False) for prompt, new in _cases(8, 8)]
    answers = served.head.client("ask", served.url(served.worker), KEY, "4", stdin=json.dumps(cases))
    for (prompt, new, _), answer in zip(cases, answers, strict=True):
        assert answer["status"] == 200 and answer["tokens"] == _alone(onnx_model, prompt, new), answer


def test_the_worker_losing_its_link_ends_its_replica_s_stream_with_an_error(served, chat_export):
    _, onnx_model = chat_export
    new = 1000
    prompt = _long_prompt(onnx_model, new)
    expected = _alone(onnx_model, prompt, new)
    (victim,) = [r for r, info in served.replicas().items() if info["ip"] == WORKER_IP]
    client = subprocess.Popen(
        served.head.command(sys.executable, "-m", "tests.apps.serving.ray_cluster_client", "stream",
                            served.url(served.head), KEY, ",".join(map(str, prompt)), str(new), victim,
                            str(WAIT_S)),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_environment(), cwd=ROOT)
    try:
        assert json.loads(client.stdout.readline() or "{}").get("streaming"), client.stderr.read()
        down = _ip("-n", served.worker.namespace, "link", "set", served.worker.link, "down")
        assert down.returncode == 0, down.stderr
        client.stdin.write("go\n")
        client.stdin.flush()
        try:
            out, _ = client.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"not within {WAIT_S} s: the stream of the worker's replica ends after the "
                        "worker lost its link (it hangs)")
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)
        _ip("-n", served.worker.namespace, "link", "set", served.worker.link, "up")  # back: Ray, which
        # took the worker for dead, tells its raylet so, and it ends with its processes
    result = json.loads(out.splitlines()[-1])
    assert not result["done"] and result["error"], result  # an error, not a finished answer
    assert result["tokens"] == expected[:len(result["tokens"])] and len(result["tokens"]) < new
    print(f"the stream ended {result['seconds']:.1f} s after the link went down: {result['error']}")


def test_sigterm_stops_the_server_and_leaves_no_replica(served):
    served.process.send_signal(signal.SIGTERM)
    try:
        served.process.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"not within {WAIT_S} s: the server ends after SIGTERM\n{served.output()}")
    assert served.process.returncode == 0, f"not a clean stop:\n{served.output()}"  # 134: aborted
    left = {r: info for r, info in served.replicas().items() if info["state"] != "DEAD"}
    assert not left, f"replicas left after SIGTERM: {left}\n{served.output()}"
    _until(lambda: not [c for host in (served.head, served.worker) for c in host.programs()
                        if "ServeReplica" in c], "no replica's process is left on either host", 60)
