"""Capture frames on a Linux interface into a pcap file (a stand-in for tcpdump).

    python -m tests.nic.capture IFACE OUT.pcap

Opens an AF_PACKET socket on IFACE (inside whatever network namespace it runs in), prints
``CAPTURING``, and records every frame, both directions, until SIGTERM.
"""

from __future__ import annotations

import select
import signal
import socket
import struct
import sys
import time

from capsvc.nicdriver.link import ETH_P_ALL


def main(interface: str, path: str) -> None:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((interface, 0))
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    with open(path, "wb") as out:
        out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        print("CAPTURING", flush=True)
        while not stopping:
            ready, _, _ = select.select([sock], [], [], 0.05)
            if not ready:
                continue
            frame = sock.recv(65536)
            now = time.time()
            sec = int(now)
            out.write(struct.pack("<IIII", sec, int((now - sec) * 1e6), len(frame), len(frame)))
            out.write(frame)
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
