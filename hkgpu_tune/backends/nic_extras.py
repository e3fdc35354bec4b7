"""NIC facts and settings pyroute2's netlink calls do not cover in full: interrupt coalescing
(pyroute2's ETHTOOL_GCOALESCE/SCOALESCE ioctl), pause frames and the firmware version (the ethtool
command: pyroute2 has neither), link speed and duplex (pyroute2); and the error mapping every
netlink call of the backends shares."""
from __future__ import annotations

import errno
import os

from hkgpu_tune.core.errors import ApplyError, HkError, UnsupportedError


def _nl_errno(e) -> int | None:
    return getattr(e, "code", None) or getattr(e, "errno", None)


def _wrap(e, what: str):
    code = _nl_errno(e)
    if code in (errno.EPERM, errno.EACCES):
        return HkError(f"{what}: permission denied (run as root)", code)
    if code in (errno.EOPNOTSUPP, errno.ENOENT, errno.ENOTSUP):
        return UnsupportedError(f"{what}: not supported by this kernel or driver ({os.strerror(code)})", code)
    return ApplyError(f"{what}: {e}", code)


def _unsupported(e, what):
    if "NotSupported" in type(e).__name__ or _nl_errno(e) in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
        return UnsupportedError(f"{what}: not supported by the driver", errno.EOPNOTSUPP)
    if _nl_errno(e) == errno.ENODEV or "No such device" in str(e):
        return HkError(f"{what}: no such device", errno.ENODEV)
    return _wrap(e, what)



class NicExtras:
    """Mixed into netlink.Ethtool, whose `e` is pyroute2's Ethtool."""

    # --- interrupt coalescing (pyroute2: the ETHTOOL_GCOALESCE ioctl), pause frames and the
    # driver's firmware (the ethtool command: pyroute2 has neither), link speed (pyroute2)
    def coalesce(self, ifname: str) -> dict:
        """{rx_usecs, tx_usecs, rx_frames, tx_frames, adaptive_rx, adaptive_tx}."""
        try:
            c = self.e.get_coalesce(ifname)
        except Exception as e:  # noqa: BLE001
            raise _unsupported(e, f"{ifname}: interrupt coalescing") from None
        return {k: (bool(c[f]) if k.startswith("adaptive") else int(c[f])) for k, f in COALESCE_FIELDS.items()}

    def set_coalesce(self, ifname: str, values: dict) -> None:
        try:
            self.e.set_coalesce(ifname, {COALESCE_FIELDS[k]: int(v) for k, v in values.items()})
        except Exception as e:  # noqa: BLE001
            raise _wrap(e, f"{ifname}: set coalesce {values}") from None

    def pause(self, ifname: str) -> dict:
        """{autoneg, rx, tx} from `ethtool --json -a`."""
        import json
        r = _ethtool_cmd(["--json", "-a", ifname], f"{ifname}: pause frames")
        try:
            d = json.loads(r.out)[0]
            return {"autoneg": bool(d["autonegotiate"]), "rx": bool(d["rx"]), "tx": bool(d["tx"])}
        except (ValueError, LookupError, TypeError):
            raise UnsupportedError(f"{ifname}: pause frames: ethtool printed no pause settings") from None

    def set_pause(self, ifname: str, values: dict) -> None:
        args = []
        for k, v in sorted(values.items()):
            args += [k, "on" if v else "off"]
        _ethtool_cmd(["-A", ifname, *args], f"{ifname}: set pause {values}", write=True)

    def link_info(self, ifname: str) -> dict:
        """{speed_mbit, duplex, autoneg, driver, firmware}: None where the driver reports none."""
        out = {"speed_mbit": None, "duplex": None, "autoneg": None, "driver": None, "firmware": None}
        try:
            m = self.e.get_link_mode(ifname)
            ok = isinstance(m.speed, int) and 0 < m.speed < 10_000_000
            out.update(speed_mbit=m.speed if ok else None, duplex=m.duplex, autoneg=m.autoneg)
        except Exception:  # noqa: BLE001 - no link settings on this driver
            pass
        try:
            r = _ethtool_cmd(["-i", ifname], f"{ifname}: driver information")
            info = dict(line.split(":", 1) for line in r.out.splitlines() if ":" in line)
            out["driver"] = info.get("driver", "").strip() or None
            out["firmware"] = info.get("firmware-version", "").strip() or None
        except HkError:
            pass
        return out


COALESCE_FIELDS = {"rx_usecs": "rx_coalesce_usecs", "tx_usecs": "tx_coalesce_usecs",
                   "rx_frames": "rx_max_coalesced_frames", "tx_frames": "tx_max_coalesced_frames",
                   "adaptive_rx": "use_adaptive_rx_coalesce", "adaptive_tx": "use_adaptive_tx_coalesce"}


def _ethtool_cmd(args: list[str], what: str, write: bool = False):
    from hkgpu_tune.backends.command import Command
    c = Command()
    if c.which("ethtool") is None:
        raise UnsupportedError(f"{what}: the ethtool command is not installed")
    r = c.run(["ethtool", *args], timeout=10)
    if r.rc != 0:
        msg = (r.err or r.out).strip().splitlines()
        msg = msg[0] if msg else f"exit {r.rc}"
        if "not supported" in msg.lower():
            raise UnsupportedError(f"{what}: not supported by the driver ({msg})", errno.EOPNOTSUPP)
        raise (ApplyError if write else HkError)(f"{what}: {msg}")
    return r


