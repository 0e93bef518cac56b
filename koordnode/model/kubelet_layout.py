"""Where kubelet keeps the pods: its cgroup driver, its top cgroup ("kubepods"), its QoS tiers and
koordnode's BE group beside them (model/be_group.py).

One `KubeletLayout` is made by the composition root (daemon.py) and handed to every component
that needs those paths (the QoS engine, the QoS manager's measuring and inventory), so they can
never disagree. Pure apart from the `exists` probe it is given: with `[cgroup] driver = "auto"`
and no `[qos_manager] kubepods_cgroup`, kubelet's top cgroup is whichever of the two exists, and
kubelet may make it after koordnode started, so `paths()` looks again each time it is asked.
"""

from __future__ import annotations

import dataclasses
import posixpath
import threading
from collections.abc import Callable

import structlog

from koordnode.model.be_group import BE_GROUP

log = structlog.get_logger("koordnode.layout")

CGROUPFS_KUBEPODS = "/kubepods"
SYSTEMD_KUBEPODS = "/kubepods.slice"


@dataclasses.dataclass(frozen=True)
class KubeletPaths:
    """The layout as resolved at one moment."""

    driver: str  # [cgroup] driver: how pod cgroup paths are made from cgroup parents
    kubepods: str
    besteffort: str
    burstable: str
    be_group: str  # koordnode's BE group cgroup beside the tiers
    be_group_slice: str | None  # its slice unit when kubepods is a systemd slice

    @property
    def tiers(self) -> dict[str, str]:
        return {"besteffort": self.besteffort, "burstable": self.burstable, "be_group": self.be_group}

    @property
    def systemd_be_group(self) -> tuple[str, str] | None:
        """(slice, cgroup) of the BE group beside the tiers, for the systemd driver; None otherwise."""
        if self.driver == "cgroupfs" or self.be_group_slice is None:
            return None
        return self.be_group_slice, self.be_group


def paths_of(driver: str, kubepods: str) -> KubeletPaths:
    """The tiers are named after kubepods itself: a ".slice" has systemd-style children."""
    kubepods = "/" + kubepods.strip("/")
    top = posixpath.basename(kubepods)
    if top.endswith(".slice") and top != ".slice":
        stem = top[: -len(".slice")]
        group_slice = f"{stem}-{BE_GROUP}.slice"
        return KubeletPaths(driver, kubepods, f"{kubepods}/{stem}-besteffort.slice",
                            f"{kubepods}/{stem}-burstable.slice", f"{kubepods}/{group_slice}", group_slice)
    base = kubepods.rstrip("/")
    return KubeletPaths(driver, kubepods, f"{base}/besteffort", f"{base}/burstable", f"{base}/{BE_GROUP}", None)


class KubeletLayout:
    """kubelet's layout from `[cgroup] driver` and `[qos_manager] kubepods_cgroup`; `exists(cgroup)`
    tells whether kubelet has made a cgroup (asked only while the driver is "auto")."""

    def __init__(self, driver: str, kubepods_cgroup: str, exists: Callable[[str], bool]) -> None:
        self._exists = exists
        self._lock = threading.Lock()
        self._paths: KubeletPaths | None = None
        self.configure(driver, kubepods_cgroup)

    def configure(self, driver: str, kubepods_cgroup: str) -> None:
        """A reloaded configuration (both values may change on reload)."""
        with self._lock:
            self._driver, self._configured = driver, kubepods_cgroup
            self._paths = None
        self.paths()

    def reconfigure(self, settings: tuple[str, str]) -> None:
        """The reload's entry: (cgroup driver, [qos_manager] kubepods_cgroup)."""
        self.configure(*settings)

    @property
    def driver(self) -> str:
        return self._driver

    def _kubepods(self) -> str:
        if self._configured:
            return self._configured
        if self._driver == "systemd":
            return SYSTEMD_KUBEPODS
        if self._driver == "cgroupfs":
            return CGROUPFS_KUBEPODS
        try:
            systemd = self._exists(SYSTEMD_KUBEPODS)
        except Exception:  # a probe that fails decides nothing: the cgroupfs default
            systemd = False
        return SYSTEMD_KUBEPODS if systemd else CGROUPFS_KUBEPODS

    def paths(self) -> KubeletPaths:
        with self._lock:
            current = self._paths
            if current is not None and (self._configured or self._driver != "auto"):
                return current  # fixed by the configuration: nothing to look at
            kubepods = self._kubepods()
            if current is None or current.kubepods != kubepods:
                if current is not None:
                    log.info("qos_kubepods_cgroup", cgroup=kubepods)
                current = self._paths = paths_of(self._driver, kubepods)
            return current
