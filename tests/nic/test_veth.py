"""A model pair whose wire is a Linux veth pair: real Ethernet frames, captured and decoded.

The test makes its own network namespace (so no interface of the machine is touched),
creates the veth pair m0/m1 in it, runs the model host there with ``--wire veth:m0,m1``
(AF_PACKET on both ends), captures m1 with a third AF_PACKET socket (tests/nic/capture.py,
since tcpdump may be absent; tcpdump -r reads the file), and runs an echo RPC and a stream
transfer between a server process and this one. The capture must decode into our segments
(EtherType 0x88B5, the ports' MACs, a valid CRC) carrying the bytes that were sent.
Skipped, with the kernel's answer, only where network namespaces or veth cannot be made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import capsvc
from capsvc.nicdriver import segment
from capsvc.nicdriver.link import read_pcap
from capsvc.nicdriver.modelhost import mac_for
from capsvc.transport.nic import connect_nic
from tests.apps.echo_app import ECHO
from tests.nic.conftest import ROOT, env
from tests.nic.test_nic_rpc import stop
from tests.support.checks import poll_until


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def netns() -> Iterator[str]:
    if shutil.which("ip") is None:
        pytest.skip("the ip command (iproute2) is not installed")
    name = f"capsvc-t-{uuid.uuid4().hex[:8]}"
    made = ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"the kernel refused a network namespace: {made.stderr.strip()}")
    try:
        veth = ip("-n", name, "link", "add", "m0", "type", "veth", "peer", "name", "m1")
        if veth.returncode != 0:
            pytest.skip(f"the kernel refused veth creation: {veth.stderr.strip()}")
        for link in ("m0", "m1"):
            subprocess.run(
                ["ip", "netns", "exec", name, "sysctl", "-q", "-w",
                 f"net.ipv6.conf.{link}.disable_ipv6=1"],
                capture_output=True, check=False,
            )  # fmt: skip
            assert ip("-n", name, "link", "set", link, "up").returncode == 0
        yield name
    finally:
        ip("netns", "del", name)


def in_netns(ns: str, *command: str, stdout: Any = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, *command],
        cwd=ROOT,
        env=env(),
        stdout=stdout,
        text=True,
    )


def wait_line(process: subprocess.Popen[str], prefix: str) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith(prefix):
        process.kill()
        raise RuntimeError(f"expected {prefix!r}, got {line!r}")
    return line


class VethRig:
    """Capture on m1, the model host on veth m0/m1, an echo server on port v.0."""

    def __init__(self, ns: str, rundir: Path, pcap: Path) -> None:
        self.processes: list[subprocess.Popen[str]] = []
        self.pcap = pcap
        capture = in_netns(ns, "-m", "tests.nic.capture", "m1", str(pcap))
        self.processes.append(capture)
        wait_line(capture, "CAPTURING")
        host = in_netns(
            ns, "-m", "capsvc.nicdriver.modelhost", "v", "--rundir", str(rundir),
            "--wire", "veth:m0,m1",
        )  # fmt: skip
        self.processes.append(host)
        wait_line(host, "READY")
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.nic.nic_server", f"nic:model:v.0,rundir={rundir}",
             "echo"],
            cwd=ROOT, env=env(), stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.processes.append(server)
        wait_line(server, "LISTENING")

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop(process)
        self.processes = []


def captured_segments(pcap: Path) -> list[segment.Segment | None]:
    """Our 0x88B5 frames in the capture so far, decoded (None: failed its CRC)."""
    frames = read_pcap(pcap)
    return [segment.decode(f) for f in frames if f[12:14] == segment.ETHERTYPE_BYTES]


def sent_by(segments: list[segment.Segment | None], mac: bytes) -> bytes:
    """The payload bytes ``mac`` sent, reassembled by sequence number (duplicates once)."""
    sent = {s.seq: s.payload for s in segments if s is not None and s.src == mac and s.payload}
    return b"".join(sent[k] for k in sorted(sent))


@pytest.fixture
def veth_rig(netns: str, rundir: Path, tmp_path: Path) -> Iterator[VethRig]:
    rig = VethRig(netns, rundir, tmp_path / "m1.pcap")
    try:
        yield rig
    finally:
        rig.stop()


async def test_frames_on_a_veth_wire_are_real_and_decodable(
    veth_rig: VethRig, rundir: Path
) -> None:
    message = "over a real veth wire"
    blob = os.urandom(5000)
    stream = await connect_nic(f"nic:model:v.1,rundir={rundir}")
    async with capsvc.open_connection(stream) as conn:
        echo: Any = conn.bootstrap(ECHO.Echo)
        assert (await echo.ping(msg=message)).reply == message
        assert (await echo.pingData(data=blob)).data == blob
    # Let the capture take in what is checked below before it is stopped (frames still
    # queued in its socket would be lost). Real time: the capture is another process,
    # reading on its own schedule; the limit only bounds a capture that misses frames.
    client_mac = mac_for("v.1")
    await poll_until(
        lambda: blob in sent_by(captured_segments(veth_rig.pcap), client_mac), within=10
    )
    await trio.to_thread.run_sync(veth_rig.stop)

    decoded = captured_segments(veth_rig.pcap)
    assert decoded, f"no 0x88B5 frames among {len(read_pcap(veth_rig.pcap))} captured"
    assert all(s is not None for s in decoded), "a captured segment failed its CRC"
    segments = [s for s in decoded if s is not None]
    server_mac = mac_for("v.0")
    assert {s.src for s in segments} == {server_mac, client_mac}
    syn = segments[0]
    assert syn.flags == segment.SYN
    assert syn.dst == b"\xff" * 6  # the client's SYN is a broadcast
    assert syn.src == client_mac
    stream_bytes = sent_by(segments, client_mac)
    assert message.encode() in stream_bytes
    assert blob in stream_bytes
    if shutil.which("tcpdump"):
        shown = await trio.run_process(
            ["tcpdump", "-r", str(veth_rig.pcap), "-e", "-n", "ether", "proto", "0x88b5"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert b"0x88b5" in shown.stdout.lower()
