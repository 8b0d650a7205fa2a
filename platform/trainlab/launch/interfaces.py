"""This machine's network interfaces: which addresses a service started here can listen on.

Read from the kernel's own list (psutil, a dependency of Ray; else /proc and an ioctl), never by
opening a socket: an address is judged before anything binds, connects or sends to it.
"""

from __future__ import annotations

import ipaddress
import socket

WILDCARDS = ("0.0.0.0", "::")
"""Every interface: Ray then picks the node's IP for its services."""


def interface_addresses() -> dict[str, tuple[str, ...]]:
    """{interface name: its IPv4 and IPv6 addresses}, IPv6 without a %scope suffix."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - Ray installs psutil; kept for the engine alone
        return _from_proc()
    families = (socket.AF_INET, socket.AF_INET6)
    return {name: tuple(a.address.split("%", 1)[0] for a in addrs if a.family in families)
            for name, addrs in psutil.net_if_addrs().items()}


def _from_proc() -> dict[str, tuple[str, ...]]:
    """Linux without psutil: IPv4 from SIOCGIFADDR on each interface, IPv6 from /proc/net/if_inet6."""
    import fcntl
    import struct

    found: dict[str, list[str]] = {}
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # an ioctl handle: never bound or used
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            found.setdefault(name, []).append(socket.inet_ntoa(raw[20:24]))
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                fields = line.split()
                addr = ipaddress.IPv6Address(int(fields[0], 16))
                found.setdefault(fields[-1], []).append(str(addr))
    except OSError:
        pass
    return {name: tuple(addrs) for name, addrs in found.items()}


def _same(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def interface_of(ip: str) -> str | None:
    """The name of the interface holding address `ip` (e.g. 'lo' for 127.0.0.1), or None."""
    for name, addrs in interface_addresses().items():
        if any(_same(ip, a) for a in addrs):
            return name
    return None


def check_listen_host(host: str, *, field: str = "cluster.host") -> None:
    """`host` is an address a local Ray cluster can listen on: loopback, a wildcard, or an IP one of
    this machine's interfaces holds. Ray, given any other, waits minutes for a bind that can never
    succeed; this says so at once, from the interface list alone."""
    if host == "localhost" or host in WILDCARDS:
        return
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"{field}={host!r} is not an IP address; Ray's services listen on an address, not a name: "
            f"use 127.0.0.1 (this machine only), this node's IP ({_listing()}) or 0.0.0.0") from None
    if ip.is_loopback or interface_of(host) is not None:
        return
    raise ValueError(
        f"{field}={host!r} is not an address of this machine (its interfaces hold {_listing()}), so "
        "nothing can listen on it; use 127.0.0.1 (this machine only), one of those, or 0.0.0.0")


def _listing() -> str:
    return ", ".join(f"{name} {a}" for name, addrs in sorted(interface_addresses().items())
                     for a in addrs) or "none"
