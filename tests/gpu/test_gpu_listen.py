"""An NCCL group set up as a trial's is (launch.bound_group: the store bound to the node IP, NCCL
pinned to its interface) listens on loopback only when the node IP is 127.0.0.1. NCCL's
bootstrap otherwise listens on the first interface that is not loopback. Skipped without CUDA;
no Ray or psutil needed: sockets are read from /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

_RUN = r"""
import ipaddress, json, os
import torch, torch.distributed as dist
from trainlab.launch.bound_group import join_group, open_store, pin_interfaces

pinned = pin_interfaces("127.0.0.1")
store = open_store("127.0.0.1", world_size=1, timeout_s=60)
join_group(backend="nccl", rank=0, world_size=1, addr="127.0.0.1", port=store.port, timeout_s=60, store=store)
t = torch.ones(4, device="cuda")
dist.all_reduce(t)  # NCCL's communicator (and its bootstrap sockets) exists from here
torch.cuda.synchronize()

def listening():
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    addr, port = cols[1].split(":")
                    raw = bytes.fromhex(addr)
                    # /proc prints each 32-bit word in host (little-endian) order
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    ip = ipaddress.ip_address(words)
                    ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:127.0.0.1 is 127.0.0.1
                    found.append(f"{ip}:{int(port, 16)}")
    return found

print(json.dumps({"pinned": pinned, "sum": t.sum().item(), "listening": listening()}))
dist.destroy_process_group()
"""


def test_an_nccl_group_on_a_local_node_listens_on_loopback_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "platform"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _RUN], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["pinned"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert seen["sum"] == 4.0
    assert seen["listening"], "no listening socket found: the check would pass vacuously"
    exposed = [s for s in seen["listening"] if not s.rsplit(":", 1)[0] in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
    assert not exposed, f"listening beyond loopback: {exposed}"
