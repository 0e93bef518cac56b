"""NodeSLO (slo.koordinator.sh/v1alpha1) -> koordnode config keys. Pure: no I/O.

`map_nodeslo(spec)` turns a NodeSLO's spec into a table in the TOML file's shape (the values
the loader then validates below the local file), with where each key came from, the fields
koordnode ignores and why, and the fields it cannot take (left out; the rest applies). The table is the
documentation's (docs/operations.md, "NodeSLO fields"); the two are kept in step by
tests/test_kube_nodeslo.py.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from koordnode.config.classes import ClassName
from koordnode.config.host_apps import HOST_APP_NAME, PRIORITY_CLASSES, cgroup_path_problem
from koordnode.model.kernel import MEMORY_HIGH_PERCENT_MAX

__all__ = ["CLASS_FIELDS", "IGNORED", "NodeSloMapping", "SCALAR_FIELDS", "map_nodeslo"]

# spec path -> (TOML key, unit note). Integers in the NodeSLO, numbers (percent, seconds) in koordnode.
SCALAR_FIELDS: dict[str, tuple[str, str]] = {
    "resourceUsedThresholdWithBE.enable": ("strategy.cpu_suppress.enable", "bool"),
    "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent": ("strategy.cpu_suppress.threshold_percent", "percent"),
    "resourceUsedThresholdWithBE.memoryEvictThresholdPercent": ("strategy.be_evict.memory_threshold_percent", "percent"),
    "resourceUsedThresholdWithBE.cpuEvictBESatisfactionLowerPercent":
        ("strategy.be_evict.cpu_satisfaction_floor_percent", "percent"),
    "resourceUsedThresholdWithBE.cpuEvictBEUsageThresholdPercent": ("strategy.be_evict.cpu_busy_percent", "percent"),
    "resourceUsedThresholdWithBE.cpuEvictTimeWindowSeconds": ("strategy.be_evict.cpu_satisfaction_duration_s", "seconds"),
    "cpuBurstStrategy.cpuBurstPercent": ("strategy.cpu_burst.burst_percent", "percent"),
    "cpuBurstStrategy.cfsQuotaBurstPercent": ("strategy.cpu_burst.max_quota_percent", "percent"),
    "cpuBurstStrategy.sharePoolThresholdPercent": ("strategy.cpu_burst.share_pool_threshold_percent", "percent"),
    "systemStrategy.watermarkScaleFactor": ("strategy.memory_qos.watermark_scale_factor", "1/10000 of memory"),
}
# Computed from more than one field (see map_nodeslo): the keys they set, for the table.
DERIVED_FIELDS: dict[str, tuple[str, str]] = {
    "resourceUsedThresholdWithBE.cpuSuppressPolicy":
        ("strategy.cpu_suppress.policy", '"cfsQuota" -> "cfs_quota", "cpuset" -> "cpuset"'),
    "resourceUsedThresholdWithBE.memoryEvictLowerPercent":
        ("strategy.be_evict.memory_margin_percent", "memoryEvictThresholdPercent - memoryEvictLowerPercent"),
    "cpuBurstStrategy.policy":
        ("strategy.cpu_burst.enable",
         '"none": off; "cpuBurstOnly": on, cfs_quota_burst false; "cfsQuotaBurstOnly": on, '
         'cfs_quota_burst true, burst_percent 0; "auto": on, cfs_quota_burst true'),
    "systemStrategy.minFreeKbytesFactor":
        ("strategy.memory_qos.min_free_kbytes", "factor / 10000 x MemTotal in kB, as koordlet computes it"),
}
# Also set by cpuSuppressThresholdPercent: the NodeSLO's threshold applies in the idle BE group too.
IDLE_GROUP_THRESHOLD = "strategy.cpu_suppress.idle_group_threshold_percent"
# resourceQOSStrategy.<classKey> -> koordnode classes (Koordinator's LSE pods take lsrClass).
CLASS_KEYS: dict[str, tuple[str, ...]] = {
    "systemClass": ("SYSTEM",), "lsrClass": ("LSR", "LSE"), "lsClass": ("LS",), "beClass": ("BE",),
}
# <classKey>.<group>.<field> -> [qos.<CLASS>] key
CLASS_FIELDS: dict[str, str] = {
    "memoryQOS.enable": "memory_qos",
    "memoryQOS.minLimitPercent": "memory_min_percent",
    "memoryQOS.lowLimitPercent": "memory_low_percent",
    "memoryQOS.throttlingPercent": "memory_high_percent",
    "memoryQOS.wmarkRatio": "memory_wmark_ratio",
    "memoryQOS.wmarkScalePermill": "memory_wmark_scale_permill",
    "memoryQOS.wmarkMinAdj": "memory_wmark_min_adj",
    "cpuQOS.groupIdentity": "cpu_bvt_warp_ns",
    "cpuQOS.schedIdle": "cpu_idle",
    "resctrlQOS.catRangeStartPercent": "resctrl.cat_range_start_percent",
    "resctrlQOS.catRangeEndPercent": "resctrl.cat_range_end_percent",
    "resctrlQOS.mbaPercent": "resctrl.mba_percent",
}
# Fields koordnode reads but does not apply, and why (prefix match on the spec path).
IGNORED: dict[str, str] = {
    "resourceUsedThresholdWithBE.cpuEvictBESatisfactionUpperPercent":
        "koordnode evicts while satisfaction stays below the lower bound; it has no release target",
    "resourceUsedThresholdWithBE.cpuEvictPolicy": "koordnode has one CPU eviction policy (by satisfaction)",
    "cpuBurstStrategy.cfsQuotaBurstPeriodSeconds":
        "koordnode scales the quota per tick while throttled, without a burst time limit",
    "resourceQOSStrategy.cgroupRoot": "koordnode sets no values on the root cgroup",
    "resourceQOSStrategy.policies": "the CPU and network policies are koordnode's own ([strategy.cpu_suppress], "
                                    '[net]); cpuPolicy "coreSched" only lets cpuQOS.coreExpeller through',
    "memoryQOS.priorityEnable": "memcg priority is an Anolis kernel feature koordnode does not implement",
    "memoryQOS.priority": "memcg priority is an Anolis kernel feature koordnode does not implement",
    "memoryQOS.oomKillGroup": "memory.oom.group is left to the runtime",
    "cpuQOS.enable": "false is read as groupIdentity 0 and schedIdle 0; true changes nothing by itself",
    "cpuQOS.coreExpeller": 'taken ([qos.<CLASS>] core_expeller) for lsrClass and lsClass with policies.cpuPolicy '
                           '"coreSched" only, as Koordinator does; SYSTEM and BE never expel',
    "resctrlQOS.enable": "resctrl is switched on per node ([resctrl] enable: it needs resctrl mounted)",
    "blkioQOS": "block devices are named per node ([node] blkio_devices, [qos.<CLASS>] blkio_*)",
    "networkQOS": "egress shaping is per node ([net]: interfaces and link rate)",
    "systemStrategy.memcgReapBackGround": "background memcg reaping is an Anolis kernel feature",
    "systemStrategy.totalNetworkBandwidth": "the link rate is per node ([net] link_rate_mbps)",
    "hostApplications[].strategy": "Koordinator defines no host application strategy fields yet",
    "extensions": "vendor extensions are not read",
}

_SUPPRESS_POLICY = {"cfsQuota": "cfs_quota", "cpuset": "cpuset"}
_BURST_POLICIES = ("none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto")


@dataclass
class NodeSloMapping:
    values: dict[str, Any] = field(default_factory=dict)  # nested, as the TOML file's tables
    fields: dict[str, str] = field(default_factory=dict)  # TOML key -> spec path it came from
    ignored: list[str] = field(default_factory=list)  # "spec path: why"
    # "spec.path: why": that field is not applied (the rest is); "spec: why": the spec is unusable
    errors: list[str] = field(default_factory=list)

    def put(self, key: str, value: Any, source: str) -> None:
        table = self.values
        parts = key.split(".")
        for part in parts[:-1]:
            table = table.setdefault(part, {})
        table[parts[-1]] = value
        self.fields[key] = source


def _get(spec: Mapping[str, Any], path: str) -> Any:
    value: Any = spec
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _integer(mapping: NodeSloMapping, path: str, value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        mapping.errors.append(f"spec.{path}: expected an integer, got {value!r:.60}")
        return None
    return value


def _boolean(mapping: NodeSloMapping, path: str, value: Any) -> bool | None:
    if not isinstance(value, bool):
        mapping.errors.append(f"spec.{path}: expected true or false, got {value!r:.60}")
        return None
    return value


def _reason(path: str) -> str | None:
    parts = path.split(".")
    return IGNORED.get(path) or IGNORED.get(".".join(parts[-2:])) or IGNORED.get(parts[-1])


def _ignore_rest(mapping: NodeSloMapping, spec: Mapping[str, Any], prefix: str, used: set[str], depth: int = 0) -> None:
    """Every set field not applied is listed with its reason (fields unknown to koordnode too)."""
    for key, value in spec.items():
        path = f"{prefix}{key}"
        if path in used or value is None:
            continue
        reason = _reason(path)
        if reason is None and isinstance(value, Mapping) and depth < 4:
            _ignore_rest(mapping, value, path + ".", used, depth + 1)
            continue
        mapping.ignored.append(f"spec.{path}: " + (reason or "not a field koordnode knows"))


def map_nodeslo(spec: Any, memory_total_bytes: int | None = None) -> NodeSloMapping:
    """The config table a NodeSLO's spec stands for. `memory_total_bytes` (MemTotal) turns
    systemStrategy.minFreeKbytesFactor into min_free_kbytes; without it that field is ignored."""
    mapping = NodeSloMapping()
    if not isinstance(spec, Mapping):
        mapping.errors.append("spec: expected an object")
        return mapping
    used: set[str] = set()

    for path, (key, unit) in SCALAR_FIELDS.items():
        value = _get(spec, path)
        if value is None:
            continue
        used.add(path)
        if unit == "bool":
            flag = _boolean(mapping, path, value)
            if flag is not None:
                mapping.put(key, flag, path)
        else:
            number = _integer(mapping, path, value)
            if number is not None:
                mapping.put(key, float(number) if unit in ("percent", "seconds") else number, path)

    if "strategy.cpu_suppress.threshold_percent" in mapping.fields:
        # Koordinator's threshold holds whether or not BE runs in koordnode's idle group.
        threshold = mapping.values["strategy"]["cpu_suppress"]["threshold_percent"]
        mapping.put(IDLE_GROUP_THRESHOLD, threshold, "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent")

    path = "resourceUsedThresholdWithBE.cpuSuppressPolicy"
    if (policy := _get(spec, path)) is not None:
        used.add(path)
        if policy in _SUPPRESS_POLICY:
            mapping.put("strategy.cpu_suppress.policy", _SUPPRESS_POLICY[policy], path)
        else:
            mapping.errors.append(f"spec.{path}: expected one of \"cfsQuota\", \"cpuset\", got {policy!r:.60}")

    path = "resourceUsedThresholdWithBE.memoryEvictLowerPercent"
    if (lower := _get(spec, path)) is not None:
        used.add(path)
        threshold = _get(spec, "resourceUsedThresholdWithBE.memoryEvictThresholdPercent")
        if _integer(mapping, path, lower) is not None:
            if not isinstance(threshold, int) or isinstance(threshold, bool):
                mapping.ignored.append(f"spec.{path}: needs memoryEvictThresholdPercent in the same NodeSLO")
            elif lower >= threshold:
                mapping.errors.append(f"spec.{path}: must be below memoryEvictThresholdPercent ({lower} >= {threshold})")
            else:
                mapping.put("strategy.be_evict.memory_margin_percent", float(threshold - lower), path)

    path = "cpuBurstStrategy.policy"
    if (burst := _get(spec, path)) is not None:
        used.add(path)
        if burst not in _BURST_POLICIES:
            mapping.errors.append(f"spec.{path}: expected one of " + ", ".join(f'"{p}"' for p in _BURST_POLICIES)
                                  + f", got {burst!r:.60}")
        else:
            mapping.put("strategy.cpu_burst.enable", burst != "none", path)
            if burst != "none":
                mapping.put("strategy.cpu_burst.cfs_quota_burst", burst != "cpuBurstOnly", path)
            if burst == "cfsQuotaBurstOnly":
                mapping.put("strategy.cpu_burst.burst_percent", 0.0, path)

    path = "systemStrategy.minFreeKbytesFactor"
    if (factor := _get(spec, path)) is not None:
        used.add(path)
        if _integer(mapping, path, factor) is not None:
            if memory_total_bytes is None:
                mapping.ignored.append(f"spec.{path}: MemTotal not known yet")
            else:
                mapping.put("strategy.memory_qos.min_free_kbytes", factor * (memory_total_bytes // 1024) // 10000, path)

    strategy = spec.get("resourceQOSStrategy")
    if isinstance(strategy, Mapping):
        for class_key, classes in CLASS_KEYS.items():
            class_spec = strategy.get(class_key)
            if class_spec is None:
                continue
            if not isinstance(class_spec, Mapping):
                used.add(f"resourceQOSStrategy.{class_key}")
                mapping.errors.append(f"spec.resourceQOSStrategy.{class_key}: expected an object")
                continue
            _map_class(mapping, class_spec, class_key, classes, used,
                       core_sched=_get(strategy, "policies.cpuPolicy") == "coreSched")
    elif strategy is not None:
        mapping.errors.append("spec.resourceQOSStrategy: expected an object")
        used.add("resourceQOSStrategy")

    if (apps := spec.get("hostApplications")) is not None:
        used.add("hostApplications")
        _map_host_apps(mapping, apps)

    _ignore_rest(mapping, spec, "", used)
    return mapping


_HOST_QOS: tuple[str, ...] = typing.get_args(ClassName)
_PRIORITIES = tuple(name for name in PRIORITY_CLASSES if name)
HOST_APP_FIELDS = {
    "hostApplications[].name": ("`host_applications.<name>`", "the table's name"),
    "hostApplications[].qos": ("`host_applications.<name>.qos`",
                               "SYSTEM, LSE, LSR, LS or BE; none: BE for koord-batch/koord-free, else LS"),
    "hostApplications[].priority": ("`host_applications.<name>.priority`", "koord-prod, koord-mid, koord-batch, koord-free"),
    "hostApplications[].cgroupPath": ("`host_applications.<name>.cgroup`",
                                      'base "CgroupRoot" (or none): parentDir/relativePath below the root; '
                                      "none: Koordinator's default host-latency-sensitive/<name>, host-best-effort/<name>"),
}


def _map_host_apps(mapping: NodeSloMapping, apps: Any) -> None:
    """spec.hostApplications -> [host_applications.<name>]; an entry koordnode cannot take is
    left out and named (the others apply)."""
    if not isinstance(apps, list):
        mapping.errors.append("spec.hostApplications: expected a list")
        return
    for index, app in enumerate(apps[:64]):
        where = f"spec.hostApplications[{index}]"
        if not isinstance(app, Mapping):
            mapping.errors.append(f"{where}: expected an object")
            continue
        name = app.get("name")
        if not isinstance(name, str) or not HOST_APP_NAME.match(name):
            mapping.errors.append(f"{where}.name: expected a name of letters, digits, _ . @ - (at most 63), "
                                  f"got {name!r:.60}")
            continue
        priority = app.get("priority") or ""
        if priority and priority not in _PRIORITIES:
            mapping.errors.append(f"{where}.priority: expected one of {', '.join(_PRIORITIES)}, got {priority!r:.60}")
            continue
        qos = app.get("qos") or ("BE" if priority in ("koord-batch", "koord-free") else "LS")
        if qos not in _HOST_QOS:
            mapping.errors.append(f"{where}.qos: expected one of {', '.join(_HOST_QOS)}, got {qos!r:.60}")
            continue
        entry: dict[str, Any] = {"qos": qos, "priority": priority}
        path = app.get("cgroupPath")
        if path is not None:
            if not isinstance(path, Mapping):
                mapping.errors.append(f"{where}.cgroupPath: expected an object")
                continue
            base = path.get("base") or "CgroupRoot"
            if base != "CgroupRoot":
                mapping.errors.append(f"{where}.cgroupPath.base: {base!r:.40} is not supported (only \"CgroupRoot\": "
                                      "koordnode keeps kubepods for pods)")
                continue
            parts = [path.get("parentDir") or "", path.get("relativePath") or ""]
            if not all(isinstance(p, str) for p in parts):
                mapping.errors.append(f"{where}.cgroupPath: parentDir and relativePath must be strings")
                continue
            cgroup = "/".join(p.strip("/") for p in parts if p.strip("/"))
            problem = cgroup_path_problem(cgroup) if cgroup else "an empty path is the root cgroup"
            if problem:
                mapping.errors.append(f"{where}.cgroupPath: {problem}")
                continue
            entry["cgroup"] = cgroup
        if app.get("strategy"):
            mapping.ignored.append(f"{where}.strategy: " + IGNORED["hostApplications[].strategy"])
        mapping.put(f"host_applications.{name}", entry, f"hostApplications[{index}]")


def _map_class(mapping: NodeSloMapping, class_spec: Mapping[str, Any], class_key: str,
               classes: tuple[str, ...], used: set[str], core_sched: bool = False) -> None:
    """`core_sched`: policies.cpuPolicy is "coreSched", without which Koordinator takes no coreExpeller."""
    prefix = f"resourceQOSStrategy.{class_key}"
    cpu = class_spec.get("cpuQOS")
    cpu_off = isinstance(cpu, Mapping) and cpu.get("enable") is False
    for sub, key in CLASS_FIELDS.items():
        path = f"{prefix}.{sub}"
        value = _get(class_spec, sub)
        if cpu_off and sub in ("cpuQOS.groupIdentity", "cpuQOS.schedIdle"):
            value = 0  # cpuQOS off: no group identity, not idle
        if value is None:
            continue
        used.add(path)
        typed = _boolean(mapping, path, value) if key == "memory_qos" else _integer(mapping, path, value)
        if typed is None:
            continue
        if key == "memory_high_percent" and typed > MEMORY_HIGH_PERCENT_MAX:
            # request + percent x (limit - request): this far above the limit it never throttles.
            mapping.ignored.append(f"spec.{path}: {typed} is above {MEMORY_HIGH_PERCENT_MAX}; applied as "
                                   f"{MEMORY_HIGH_PERCENT_MAX} (memory.high far above the limit either way)")
            typed = MEMORY_HIGH_PERCENT_MAX
        for qos_class in classes:
            mapping.put(f"qos.{qos_class}.{key}", typed, path)
    path = f"{prefix}.cpuQOS.coreExpeller"
    expeller = _get(class_spec, "cpuQOS.coreExpeller")
    if expeller is not None and core_sched and not {"SYSTEM", "BE"} & set(classes):
        used.add(path)
        if (flag := _boolean(mapping, path, expeller)) is not None:
            for qos_class in classes:
                mapping.put(f"qos.{qos_class}.core_expeller", flag and not cpu_off, path)


# Where a class field's value has more to it than the key (Koordinator's formula, a limit).
_CLASS_NOTES = {
    "memoryQOS.throttlingPercent": "memory.high = request + percent x (limit - request), whole pages; above 1000: 1000",
    "cpuQOS.groupIdentity": "bvt warp ns (Anolis); cpuQOS.enable false: 0",
    "cpuQOS.schedIdle": "cpu.idle of the pods; cpuQOS.enable false: 0",
}


_IN_PART = ("cpuQOS.enable", "cpuQOS.coreExpeller")  # read under conditions their reason names


def nodeslo_table() -> str:
    """Every NodeSLO field koordnode knows, as a Markdown table: the key it sets and how, or why
    it is not applied (docs/architecture.md holds this text; tests/test_docs.py compares)."""
    rows = [(path, f"`{key}`", unit) for path, (key, unit) in SCALAR_FIELDS.items()]
    rows.append(("resourceUsedThresholdWithBE.cpuSuppressThresholdPercent", f"`{IDLE_GROUP_THRESHOLD}`",
                 "the same threshold in koordnode's idle BE group"))
    rows += [(path, f"`{key}`", rule) for path, (key, rule) in DERIVED_FIELDS.items()]
    classes = ", ".join(f"{name}: {'/'.join(found)}" for name, found in CLASS_KEYS.items())
    rows += [(f"resourceQOSStrategy.<class>.{sub}", f"`qos.<CLASS>.{key}`", _CLASS_NOTES.get(sub, classes))
             for sub, key in CLASS_FIELDS.items()]
    rows += [(path, key, rule) for path, (key, rule) in HOST_APP_FIELDS.items()]
    rows += [(path, "in part" if path in _IN_PART else "not applied", reason) for path, reason in IGNORED.items()]
    lines = ["| NodeSLO field (`spec.`) | koordnode | unit, rule or why not |", "|---|---|---|"]
    lines += [f"| `{path}` | {key} | {rule.replace('|', '/')} |" for path, key, rule in rows]
    return "\n".join(lines) + "\n"
