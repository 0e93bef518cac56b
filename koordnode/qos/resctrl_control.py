"""The resctrl controller: runs the resctrl policy (policy/resctrl.py) through the resctrl
writer (executor/resctrl.py): groups per class when enabled, none when disabled, and every
container's threads in its class's group."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from koordnode.executor.write_result import WriteStatus
from koordnode.executor.originals import OriginalsJournal
from koordnode.executor.paths import CgroupDriver, UnsafePathError, container_cgroup_path
from koordnode.executor.resctrl import (
    ResctrlExecutor,
    ResctrlIO,
    ResctrlResult,
    ResctrlUnsupported,
    detect_resctrl,
)
from koordnode.config.cgroup import CgroupConfig
from koordnode.config.components import ResctrlSettings
from koordnode.config.resctrl import (
    RESCTRL_GROUP_CLASSES,
    ResctrlClassConfig,
    ResctrlConfig,
    resctrl_class_defaults,
)
from koordnode.model.state import CONTAINER_EXITED, POD_READY, NodeState
from koordnode.policy.resctrl import (
    ResctrlInfo,
    SchemataError,
    group_name,
    group_of_class,
    plan_groups,
)

__all__ = ["ResctrlController", "ResctrlReport", "containers_by_group"]

# ---------------------------------------------------------------------------------------------
# Controller: config + state -> groups and task placement


ThreadsOf = Callable[[str], "list[int] | None"]


@dataclass
class ResctrlReport:
    """Outcome of one reconcile (also what `koordnode status` shows)."""

    enabled: bool
    supported: bool | None = None  # None: not probed (disabled)
    reason: str = ""  # why unsupported, or why nothing was done
    groups: dict[str, str] = field(default_factory=dict)  # name -> schemata text
    results: list[ResctrlResult] = field(default_factory=list)

    @property
    def failures(self) -> list[ResctrlResult]:
        return [r for r in self.results if r.status is WriteStatus.FAILED]

    @property
    def moved(self) -> int:
        return sum(len(r.moved) for r in self.results)


class ResctrlController:
    """Runs the resctrl policy: groups per class when enabled, none when disabled.

    ``threads_of(cgroup)`` lists a container cgroup's thread ids (None when it is gone), e.g.
    ``lambda cg: cgroup_executor.read_pids(cg, threads=True)``.
    """

    def __init__(
        self,
        config: ResctrlConfig,
        class_configs: Mapping[str, ResctrlClassConfig] | None = None,
        *,
        threads_of: ThreadsOf,
        io: ResctrlIO | None = None,
        logger: Any = None,
        originals: OriginalsJournal | None = None,
    ) -> None:
        self._io = io or ResctrlIO()
        self._originals = originals  # handed to the executor: groups created, schemata changed
        self._logger = logger  # also handed to the executor (None: structlog's)
        self._log = logger if logger is not None else structlog.get_logger("koordnode.resctrl")
        self._threads_of = threads_of
        self._executor: ResctrlExecutor | None = None
        self._info: ResctrlInfo | None = None
        self._unsupported: str | None = None
        self.config = config
        self.class_configs = self._with_defaults(class_configs)
        self.last_report = ResctrlReport(enabled=config.enable)
        self._dry_run = False

    @property
    def dry_run(self) -> bool:
        return self._dry_run

    @dry_run.setter
    def dry_run(self, value: bool) -> None:
        self._dry_run = value
        if self._executor is not None:
            self._executor.dry_run = value

    @staticmethod
    def _with_defaults(configs: Mapping[str, ResctrlClassConfig] | None) -> dict[str, ResctrlClassConfig]:
        configs = configs or {}
        return {c: configs.get(c) or resctrl_class_defaults(c) for c in RESCTRL_GROUP_CLASSES}

    def update_config(
        self, config: ResctrlConfig, class_configs: Mapping[str, ResctrlClassConfig] | None = None
    ) -> None:
        """New settings (config reload); a changed root, prefix or vendor re-probes the machine.

        Groups under an old prefix stay until the daemon is restarted with the old prefix
        and disabled: a prefix change cannot tell koordnode's old groups from foreign ones.
        """
        if (config.root, config.procfs_root, config.vendor) != (
            self.config.root, self.config.procfs_root, self.config.vendor
        ):
            self._executor, self._info, self._unsupported = None, None, None
        self.config = config
        self.class_configs = self._with_defaults(class_configs)

    def reconfigure(self, settings: ResctrlSettings) -> None:
        """A reload: the new settings, and the machine probed again (resctrl may have been
        mounted since)."""
        self.update_config(settings.resctrl, settings.classes)
        self.forget_probe()

    @property
    def group_names(self) -> dict[str, str]:
        """group class -> directory name."""
        return {c: group_name(self.config.group_prefix, c) for c in RESCTRL_GROUP_CLASSES}

    def _probe(self) -> ResctrlInfo | None:
        if self._info is not None or self._unsupported is not None:
            return self._info
        try:
            self._info = detect_resctrl(self.config.root, self.config.procfs_root,
                                        self.config.vendor, self._io)
            self._executor = ResctrlExecutor(self.config.root, io=self._io, logger=self._logger,
                                             dry_run=self._dry_run, originals=self._originals)
            self._log.info("resctrl_detected", root=self.config.root, vendor=self._info.vendor.value,
                           resources=list(self._info.managed_resources),
                           num_closids=self._info.num_closids)
        except ResctrlUnsupported as err:
            self._unsupported = str(err)
            self._log.warning("resctrl_unsupported", root=self.config.root, reason=str(err))
        return self._info

    def forget_probe(self) -> None:
        """Probe the machine again on the next reconcile (e.g. resctrl was mounted since)."""
        self._executor, self._info, self._unsupported = None, None, None

    def reconcile(self, containers_by_group: Mapping[str, Iterable[str]], *, force: bool = False) -> ResctrlReport:
        """Converge: groups and schemata per class, and each container's threads in its group.

        ``containers_by_group`` maps a group class (LSR, LS, BE) to the cgroup paths of the
        containers whose pods belong to it (see resctrl_policy.containers_by_group).
        """
        if not self.config.enable:
            report = self.disable()
            self.last_report = report
            return report
        report = ResctrlReport(enabled=True)
        info = self._probe()
        if info is None or self._executor is None:
            report.supported, report.reason = False, self._unsupported or ""
            self.last_report = report
            return report
        report.supported = True
        try:
            plans = plan_groups(info, self.class_configs, self.config.group_prefix,
                                self.config.amd_max_bandwidth_gbps)
        except SchemataError as err:
            report.reason = f"no plan: {err}"
            self._log.warning("resctrl_plan_failed", error=str(err))
            self.last_report = report
            return report
        ready: set[str] = set()
        for plan in plans:
            results = self._executor.ensure_group(plan, reason=f"resctrl {plan.group_class}", force=force)
            report.results += results
            report.groups[plan.name] = plan.text.strip()
            if all(r.ok for r in results):
                ready.add(plan.group_class)
        for group_class, cgroups in containers_by_group.items():
            if group_class in ready:
                report.results += self._sync(group_class, cgroups)
        self.last_report = report
        return report

    def place_container(self, group_class: str | None, cgroup: str) -> list[ResctrlResult]:
        """Move one container's threads now (on container start); no-op when disabled."""
        if not self.config.enable or group_class not in RESCTRL_GROUP_CLASSES:
            return []
        if self._probe() is None or self._executor is None:
            return []
        if not self._executor.group_exists(self.group_names[group_class]):
            return []  # the next reconcile creates it and places the threads
        return self._sync(group_class, [cgroup])

    def _sync(self, group_class: str, cgroups: Iterable[str]) -> list[ResctrlResult]:
        assert self._executor is not None
        tids: set[int] = set()
        for cgroup in cgroups:
            try:
                threads = self._threads_of(cgroup)
            except (OSError, ValueError) as err:
                self._log.debug("resctrl_threads_unreadable", cgroup=cgroup, error=str(err))
                continue
            tids.update(threads or ())
        if not tids:
            return []
        name = self.group_names[group_class]
        return [self._executor.move_threads(name, tids, reason=f"resctrl {group_class}")]

    def disable(self) -> ResctrlReport:
        """Remove koordnode's groups (their threads return to the root group)."""
        report = ResctrlReport(enabled=False)
        try:
            executor = self._executor or ResctrlExecutor(self.config.root, io=self._io,
                                                         logger=self._logger, dry_run=self._dry_run)
        except ValueError:
            return report  # no resctrl mount: nothing of ours can exist
        for name in executor.existing_groups(self.group_names.values()):
            report.results.append(executor.remove_group(name, reason="resctrl disabled"))
        return report

    def status(self) -> dict[str, Any]:
        report = self.last_report
        return {
            "enabled": report.enabled,
            "supported": report.supported,
            "reason": report.reason,
            "vendor": self._info.vendor.value if self._info else None,
            "groups": dict(report.groups),
            "failures": [f"{r.action} {r.group}: {r.detail}" for r in report.failures],
        }


class ResctrlPlacement:
    """Which resctrl group a pod's containers belong in, from the node state: a started
    container's threads moved at once (the hw-qos hook's StartContainer Post, in a thread), and
    every container's cgroup for the reconcile pass."""

    def __init__(self, controller: ResctrlController, state: NodeState, cgroup: CgroupConfig) -> None:
        self._controller = controller
        self._state = state
        self._driver = cgroup.driver

    def reconfigure(self, cgroup: CgroupConfig) -> None:
        self._driver = cgroup.driver

    @property
    def enabled(self) -> bool:
        return self._controller.config.enable

    def place_container(self, container_id: str) -> None:
        if not self.enabled:
            return
        pod = self._state.pod_of_container(container_id)
        group = group_of_class(pod.qos_class) if pod is not None else None
        if pod is None or group is None:
            return
        try:
            cgroup = container_cgroup_path(pod.cgroup_parent, container_id, self._driver)
        except UnsafePathError:
            return
        self._controller.place_container(group, cgroup)

    def groups(self) -> dict[str, list[str]]:
        """For the reconcile pass (on the loop): the containers of each group; none while
        disabled (the pass then only removes koordnode's groups)."""
        if not self.enabled:
            return {}
        return containers_by_group(self._state, self._driver)


def containers_by_group(
    state: NodeState, driver: CgroupDriver | str = CgroupDriver.AUTO
) -> dict[str, list[str]]:
    """Group class -> cgroup paths of the live containers of ready pods in that group.

    Pods without a class or of class SYSTEM are left out (they stay in the root group).
    """
    out: dict[str, list[str]] = {}
    for pod in sorted(state.pods.values(), key=lambda p: p.sandbox_id):
        group = group_of_class(pod.qos_class)
        if group is None or pod.state != POD_READY:
            continue
        for container in sorted(state.containers_of(pod.sandbox_id), key=lambda c: c.container_id):
            if container.state == CONTAINER_EXITED:
                continue
            try:
                path = container_cgroup_path(pod.cgroup_parent, container.container_id, driver)
            except UnsafePathError:
                continue
            out.setdefault(group, []).append(path)
    return out
