"""resctrl: policy values, detection and the controller on fake Intel / AMD resctrl mounts."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from fake_resctrl import (
    AMD_EPYC_16CCD,
    INTEL_L3_ONLY,
    INTEL_SPARSE_IDS,
    INTEL_XEON_2S,
    NO_RDT,
    FakeResctrlKernel,
    make_resctrl,
)
from koordnode.config import ConfigError, from_dict
from koordnode.cri import api_pb2 as pb
from koordnode.executor.write_result import WriteStatus
from koordnode.executor.resctrl import (
    ResctrlExecutor,
    ResctrlUnsupported,
    detect_resctrl,
)
from koordnode.config.resctrl import ResctrlClassConfig, ResctrlConfig, resctrl_class_defaults
from koordnode.policy.resctrl import (
    CacheInfo,
    MemBandwidthInfo,
    SchemataError,
    Vendor,
    cache_mask,
    mb_value,
    parse_schemata,
    render_schemata,
    threads_to_move,
)
from koordnode.model.state import CONTAINER_EXITED, ContainerRecord, NodeState, PodRecord
from koordnode.qos.resctrl_control import ResctrlController, containers_by_group


class RecordingLogger:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def _record(self, level: str, event: str, **fields: Any) -> None:
        self.events.append((level, event, fields))

    def debug(self, event: str, **fields: Any) -> None:
        self._record("debug", event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._record("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._record("warning", event, **fields)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for _, name, fields in self.events if name == event]


# ---------------------------------------------------------------------------------------------
# Policy values

XEON_L3 = CacheInfo(cbm_mask=0x7FF, min_cbm_bits=1, num_closids=16)
EPYC_L3 = CacheInfo(cbm_mask=0xFFFF, min_cbm_bits=0, num_closids=16)
XEON_MB = MemBandwidthInfo(min_bandwidth=10, bandwidth_gran=10, delay_linear=True, num_closids=8)
EPYC_MB = MemBandwidthInfo(min_bandwidth=0, bandwidth_gran=1, delay_linear=False, num_closids=16)


@pytest.mark.parametrize(
    ("cache", "start", "end", "mask"),
    [
        (XEON_L3, 0, 100, 0x7FF),
        (XEON_L3, 0, 30, 0x00F),  # 3.3 of 11 ways rounds out to 4
        (XEON_L3, 50, 100, 0x7E0),  # ways 5..10
        (XEON_L3, 0, 1, 0x001),  # a sliver still gets one way
        (XEON_L3, 99, 100, 0x400),
        (EPYC_L3, 0, 30, 0x001F),  # 4.8 of 16 ways -> 5
        (EPYC_L3, 25, 75, 0x0FF0),
        (CacheInfo(0xFF, 2, 4), 90, 100, 0xC0),  # widened downwards to min_cbm_bits
        (CacheInfo(0xFF, 3, 4), 0, 5, 0x07),  # widened upwards
        (CacheInfo(0xFF0, 1, 4), 0, 50, 0x0F0),  # a cbm_mask not starting at bit 0
    ],
)
def test_cache_mask(cache: CacheInfo, start: int, end: int, mask: int) -> None:
    assert cache_mask(cache, start, end) == mask


def test_cache_mask_refuses_empty_range() -> None:
    with pytest.raises(SchemataError):
        cache_mask(XEON_L3, 30, 30)


def test_cache_info_rejects_impossible_hardware_facts() -> None:
    with pytest.raises(SchemataError, match="contiguous"):
        CacheInfo(cbm_mask=0x505, min_cbm_bits=1, num_closids=16)
    with pytest.raises(SchemataError, match="min_cbm_bits"):
        CacheInfo(cbm_mask=0x3, min_cbm_bits=4, num_closids=16)


@pytest.mark.parametrize(
    ("vendor", "mb", "percent", "gbps", "value"),
    [
        (Vendor.INTEL, XEON_MB, 100, 0, 100),
        (Vendor.INTEL, XEON_MB, 50, 0, 50),
        (Vendor.INTEL, XEON_MB, 15, 0, 20),  # rounded up to bandwidth_gran
        (Vendor.INTEL, XEON_MB, 5, 0, 10),  # raised to min_bandwidth
        (Vendor.INTEL, MemBandwidthInfo(15, 10, True, 8), 1, 0, 20),  # min, then granularity
        (Vendor.AMD, EPYC_MB, 100, 32.0, 2048),  # unlimited
        (Vendor.AMD, EPYC_MB, 50, 32.0, 128),  # 16 GB/s in 1/8 GB/s units
        (Vendor.AMD, EPYC_MB, 30, 25.0, 60),
        (Vendor.AMD, EPYC_MB, 1, 0.125, 1),  # never 0 (which would stop the domain)
        (Vendor.AMD, EPYC_MB, 99, 256.0, 2028),  # 2027.52 rounded up, below "unlimited"
    ],
)
def test_mb_value(vendor: Vendor, mb: MemBandwidthInfo, percent: int, gbps: float, value: int) -> None:
    assert mb_value(vendor, mb, percent, gbps) == value


def test_parse_schemata_reads_the_kernels_padded_output() -> None:
    text = "    MB:0=2048;1=  16;2=2048\n    L3:0=ffff;1=000f;2=ffff\nL3CODE:0=fffff\n"
    assert parse_schemata(text) == {
        "MB": {0: 2048, 1: 16, 2: 2048},
        "L3": {0: 0xFFFF, 1: 0xF, 2: 0xFFFF},
        "L3CODE": {0: 0xFFFFF},
    }


@pytest.mark.parametrize("text", ["L3 0=ff\n", "L3:0=zz\n", "L3:x=ff\n", "L3:0\n", "L3:0=f\nL3:1=f\n"])
def test_parse_schemata_rejects_garbage(text: str) -> None:
    with pytest.raises(SchemataError):
        parse_schemata(text)


def test_render_schemata_is_newline_terminated_with_sparse_ids() -> None:
    assert render_schemata({"L3": {0: 0xF, 2: 0xF}, "MB": {0: 20, 2: 20}}) == "L3:0=f;2=f\nMB:0=20;2=20\n"


def test_threads_to_move() -> None:
    assert threads_to_move([5, 3, 9, 3], [9, 1]) == [3, 5]
    assert threads_to_move([], [1]) == []


# ---------------------------------------------------------------------------------------------
# Detection


def test_detect_intel_xeon_two_sockets(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    info = detect_resctrl(kernel.root, procfs, "auto", kernel)
    assert info.vendor is Vendor.INTEL
    assert dict(info.domains) == {"L3": (0, 1), "MB": (0, 1)}
    assert info.caches["L3"] == CacheInfo(0x7FF, 1, 16)
    assert info.mb == MemBandwidthInfo(10, 10, True, 8)
    assert info.num_closids == 8  # the smallest of all resources
    assert info.managed_resources == ("L3", "MB")


def test_detect_amd_epyc_sixteen_domains(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, AMD_EPYC_16CCD)
    # As the kernel prints it: MB first, values padded to 4 characters.
    assert kernel.schemata("").startswith("MB:0=2048;1=2048;")
    assert "L3:0=ffff;1=ffff;" in kernel.schemata("")
    info = detect_resctrl(kernel.root, procfs, "auto", kernel)
    assert info.vendor is Vendor.AMD
    assert info.domains["L3"] == tuple(range(16)) == info.domains["MB"]
    assert info.caches["L3"] == CacheInfo(0xFFFF, 0, 16)
    assert info.mb == MemBandwidthInfo(0, 1, False, 16)
    assert info.managed_resources == ("MB", "L3")


def test_detect_sparse_ids_and_missing_mb(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path / "sparse", INTEL_SPARSE_IDS)
    assert detect_resctrl(kernel.root, procfs, io=kernel).domains["L3"] == (0, 2)
    kernel, procfs = make_resctrl(tmp_path / "l3only", INTEL_L3_ONLY)
    info = detect_resctrl(kernel.root, procfs, io=kernel)
    assert info.mb is None and info.managed_resources == ("L3",)
    assert not (kernel.root / "info" / "MB").exists()


def test_vendor_setting_overrides_cpuinfo(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    assert detect_resctrl(kernel.root, procfs, "amd", kernel).vendor is Vendor.AMD


def test_detect_reports_why_it_is_unsupported(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path / "none", NO_RDT)
    with pytest.raises(ResctrlUnsupported, match="no resctrl filesystem mounted"):
        detect_resctrl(kernel.root, procfs, io=kernel)
    with pytest.raises(ResctrlUnsupported, match="does not exist"):
        detect_resctrl(tmp_path / "nowhere", procfs)
    # Mounted, but the CPU flags confirm nothing (cat_l3 / mba missing).
    machine = dataclasses.replace(INTEL_XEON_2S, flags="fpu sse sse2 ht")
    kernel, procfs = make_resctrl(tmp_path / "noflags", machine)
    with pytest.raises(ResctrlUnsupported, match="no L3 CAT or MBA"):
        detect_resctrl(kernel.root, procfs, io=kernel)
    kernel, procfs = make_resctrl(tmp_path / "via", dataclasses.replace(INTEL_XEON_2S, vendor_id="CentaurHauls"))
    with pytest.raises(ResctrlUnsupported, match="CentaurHauls"):
        detect_resctrl(kernel.root, procfs, io=kernel)


def test_mba_mbps_mount_leaves_mb_alone(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    kernel.values[""]["MB"] = {0: 4294967295, 1: 4294967295}  # mount -o mba_MBps
    kernel._sync_files("")
    info = detect_resctrl(kernel.root, procfs, io=kernel)
    assert info.mb is None and info.managed_resources == ("L3",)


# ---------------------------------------------------------------------------------------------
# Controller on fake machines

LS_CG = "/kubepods/burstable/podls/ls1"
LSE_CG = "/kubepods/podlse/lse1"
BE_CG = "/kubepods/besteffort/podbe/be1"


def controller(
    kernel: FakeResctrlKernel,
    procfs: Path,
    threads: dict[str, list[int]] | None = None,
    *,
    enable: bool = True,
    classes: dict[str, ResctrlClassConfig] | None = None,
    log: RecordingLogger | None = None,
    **settings: Any,
) -> ResctrlController:
    config = ResctrlConfig(enable=enable, root=str(kernel.root), procfs_root=str(procfs), **settings)
    threads = threads if threads is not None else {}
    return ResctrlController(config, classes, threads_of=lambda cg: threads.get(cg), io=kernel,
                             logger=log or RecordingLogger())


def test_intel_groups_and_schemata_byte_for_byte(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    classes = {"BE": ResctrlClassConfig(0, 30, mba_percent=15)}
    report = controller(kernel, procfs, classes=classes).reconcile({})
    assert report.supported and not report.failures
    # What koordnode wrote, one write per group:
    assert kernel.writes("schemata") == [
        ("koordnode-BE/schemata", "L3:0=f;1=f\nMB:0=20;1=20\n"),
    ]
    # LSR and LS keep the kernel's defaults for a new group (all ways, 100 %): no write.
    assert [op for op in kernel.ops if op[0] == "mkdir"] == [
        ("mkdir", "koordnode-LSR", ""), ("mkdir", "koordnode-LS", ""), ("mkdir", "koordnode-BE", "")]
    # What the kernel shows afterwards:
    assert kernel.schemata("koordnode-BE") == "L3:0=00f;1=00f\nMB:0= 20;1= 20\n"
    assert kernel.schemata("koordnode-LSR") == "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"
    assert kernel.schemata("koordnode-LS") == "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"
    assert kernel.schemata("") == "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"  # root untouched
    assert report.groups["koordnode-BE"] == "L3:0=f;1=f\nMB:0=20;1=20"


def test_amd_epyc_absolute_bandwidth_byte_for_byte(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, AMD_EPYC_16CCD)
    classes = {"LS": ResctrlClassConfig(0, 100, mba_percent=75),
               "BE": ResctrlClassConfig(0, 30, mba_percent=50)}
    report = controller(kernel, procfs, classes=classes, amd_max_bandwidth_gbps=25.0).reconcile({})
    assert not report.failures
    ids = range(16)
    # 75 % of 25 GB/s = 18.75 GB/s = 150 units; 50 % = 12.5 GB/s = 100 units.
    be_text = ("MB:" + ";".join(f"{i}=100" for i in ids) + "\n"
               "L3:" + ";".join(f"{i}=1f" for i in ids) + "\n")
    ls_text = ("MB:" + ";".join(f"{i}=150" for i in ids) + "\n"
               "L3:" + ";".join(f"{i}=ffff" for i in ids) + "\n")
    assert kernel.writes("schemata") == [("koordnode-LS/schemata", ls_text),
                                         ("koordnode-BE/schemata", be_text)]
    assert kernel.schemata("koordnode-BE") == (
        "MB:" + ";".join(f"{i}= 100" for i in ids) + "\n"
        "L3:" + ";".join(f"{i}=001f" for i in ids) + "\n")
    assert kernel.schemata("koordnode-LSR") == kernel.schemata("")  # 2048 = unlimited, all ways


def test_sparse_cache_ids_are_all_written(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_SPARSE_IDS)
    controller(kernel, procfs).reconcile({})
    assert kernel.writes("schemata") == [("koordnode-BE/schemata", "L3:0=f;2=f\nMB:0=100;2=100\n")]
    assert kernel.schemata("koordnode-BE") == "L3:0=00f;2=00f\nMB:0=100;2=100\n"


def test_machine_without_mb_gets_l3_only(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_L3_ONLY)
    classes = {"BE": ResctrlClassConfig(10, 40, mba_percent=20)}  # MB asked for, not offered
    report = controller(kernel, procfs, classes=classes).reconcile({})
    assert not report.failures
    # 20 ways: 10 % -> way 2, 40 % -> way 8 (exclusive): bits 2..7.
    assert kernel.writes("schemata") == [("koordnode-BE/schemata", "L3:0=fc;1=fc\n")]
    assert kernel.schemata("koordnode-BE") == "L3:0=000fc;1=000fc\n"


def test_cdp_mount_gets_the_same_mask_for_code_and_data(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, dataclasses.replace(INTEL_XEON_2S, cdp=True))
    # The kernel pads names to the longest one: "    MB".
    assert kernel.schemata("") == "L3DATA:0=7ff;1=7ff\nL3CODE:0=7ff;1=7ff\n    MB:0=100;1=100\n"
    report = controller(kernel, procfs).reconcile({})
    assert not report.failures
    assert kernel.writes("schemata") == [
        ("koordnode-BE/schemata", "L3DATA:0=f;1=f\nL3CODE:0=f;1=f\nMB:0=100;1=100\n")]
    assert kernel.schemata("koordnode-BE") == (
        "L3DATA:0=00f;1=00f\nL3CODE:0=00f;1=00f\n    MB:0=100;1=100\n")


def test_reconcile_is_idempotent_and_repairs_only_what_drifted(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    ctl = controller(kernel, procfs)
    ctl.reconcile({})
    before = list(kernel.ops)
    report = ctl.reconcile({})
    assert [op for op in kernel.ops[len(before):] if op[0] != "read"] == []
    assert {r.status for r in report.results} == {WriteStatus.UNCHANGED}
    # Someone narrows LS on socket 1 only; the next pass rewrites LS, nothing else.
    kernel.set_values("koordnode-LS", "L3", {1: 0x3})
    writes = len(kernel.writes())
    ctl.reconcile({})
    assert kernel.writes()[writes:] == [
        ("koordnode-LS/schemata", "L3:0=7ff;1=7ff\nMB:0=100;1=100\n")]
    assert kernel.schemata("koordnode-LS") == "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"


def test_partial_writes_only_touch_named_domains_and_read_back_checks_ours(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    executor = ResctrlExecutor(kernel.root, io=kernel, logger=RecordingLogger())
    kernel.mkdir(kernel.root / "g")
    kernel.write(kernel.root / "g" / "schemata", "L3:1=3\n")
    assert kernel.schemata("g") == "L3:0=7ff;1=003\nMB:0=100;1=100\n"
    assert executor.group_exists("g")


def test_kernel_refusal_is_reported_with_last_cmd_status(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    # info/ promises min_cbm_bits 1, but the (model) hardware wants 4: the write is refused.
    kernel.machine = dataclasses.replace(INTEL_XEON_2S, min_cbm_bits=4)
    log = RecordingLogger()
    report = controller(kernel, procfs, classes={"BE": ResctrlClassConfig(0, 10)}, log=log).reconcile({})
    (failure,) = report.failures
    assert failure.group == "koordnode-BE" and failure.action == "schemata"
    assert "EINVAL" in failure.detail and "Need at least 4 bits" in failure.detail
    assert log.named("resctrl_write_failed")


def test_out_of_closids_is_a_clear_failure(tmp_path: Path) -> None:
    machine = dataclasses.replace(
        INTEL_XEON_2S, l3_num_closids=3,
        mb=dataclasses.replace(INTEL_XEON_2S.mb, num_closids=3))  # type: ignore[type-var]
    kernel, procfs = make_resctrl(tmp_path, machine)
    report = controller(kernel, procfs).reconcile({})
    (failure,) = report.failures
    assert failure.action == "mkdir" and failure.group == "koordnode-BE"
    assert "ENOSPC" in failure.detail and "CLOSID" in failure.detail


def test_threads_are_moved_once_and_resynced(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S, root_tasks=(1, 2))
    kernel.spawn(100, 101, 200, 201, 300)
    threads = {LS_CG: [100, 101], BE_CG: [200, 201], LSE_CG: [300]}
    log = RecordingLogger()
    ctl = controller(kernel, procfs, threads, log=log)
    by_group = {"LS": [LS_CG], "BE": [BE_CG], "LSR": [LSE_CG]}
    report = ctl.reconcile(by_group)
    assert report.moved == 5
    assert kernel.tasks["koordnode-LS"] == [100, 101]
    assert kernel.tasks["koordnode-BE"] == [200, 201]
    assert kernel.tasks["koordnode-LSR"] == [300]
    assert kernel.tasks[""] == [1, 2]
    assert (kernel.root / "koordnode-BE" / "tasks").read_text() == "200\n201\n"
    assert kernel.writes("tasks") == [  # in the order of by_group, ascending ids
        ("koordnode-LS/tasks", "100\n"), ("koordnode-LS/tasks", "101\n"),
        ("koordnode-BE/tasks", "200\n"), ("koordnode-BE/tasks", "201\n"),
        ("koordnode-LSR/tasks", "300\n"),
    ]
    assert log.named("resctrl_tasks_moved")
    count = len(kernel.writes("tasks"))

    # Nothing changed: nothing written.
    ctl.reconcile(by_group)
    assert len(kernel.writes("tasks")) == count

    # A process joined into the BE container from outside (kubectl exec) starts in the
    # root group; the re-sync moves just that one.
    kernel.spawn(202)
    threads[BE_CG].append(202)
    ctl.reconcile(by_group)
    assert kernel.writes("tasks")[count:] == [("koordnode-BE/tasks", "202\n")]
    assert kernel.tasks["koordnode-BE"] == [200, 201, 202]


def test_thread_exiting_before_its_move_is_not_a_failure(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    kernel.spawn(200)
    ctl = controller(kernel, procfs, {BE_CG: [200, 201]})  # 201 already exited
    report = ctl.reconcile({"BE": [BE_CG]})
    (tasks,) = [r for r in report.results if r.action == "tasks"]
    assert tasks.status is WriteStatus.WRITTEN and tasks.moved == (200,) and tasks.gone == (201,)
    assert not report.failures


def test_place_container_on_start(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    kernel.spawn(200, 201)
    ctl = controller(kernel, procfs, {BE_CG: [200, 201]})
    assert ctl.place_container("BE", BE_CG) == []  # groups not created yet: next reconcile
    ctl.reconcile({})
    (result,) = ctl.place_container("BE", BE_CG)
    assert result.moved == (200, 201) and kernel.tasks["koordnode-BE"] == [200, 201]
    assert ctl.place_container(None, BE_CG) == []  # SYSTEM / unknown class: root group


def test_disable_removes_groups_and_returns_tasks_to_root(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S, root_tasks=(1,))
    kernel.spawn(200)
    ctl = controller(kernel, procfs, {BE_CG: [200]})
    ctl.reconcile({"BE": [BE_CG]})
    kernel.mkdir(kernel.root / "someone-elses")  # not ours: never touched
    assert kernel.tasks["koordnode-BE"] == [200]

    ctl.update_config(dataclasses.replace(ctl.config, enable=False))
    report = ctl.reconcile({"BE": [BE_CG]})
    assert sorted(r.group for r in report.results if r.action == "rmdir") == [
        "koordnode-BE", "koordnode-LS", "koordnode-LSR"]
    assert sorted(p.name for p in kernel.root.iterdir()) == [
        "cpus", "cpus_list", "info", "mode", "mon_data", "mon_groups", "schemata",
        "size", "someone-elses", "tasks"]
    assert kernel.tasks[""] == [1, 200]
    ops = len(kernel.ops)
    ctl.reconcile({})
    assert len(kernel.ops) == ops  # nothing left to remove


def test_disabled_by_default_touches_nothing(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    assert ResctrlConfig().enable is False
    report = controller(kernel, procfs, enable=False).reconcile({"BE": [BE_CG]})
    assert report.results == [] and kernel.ops == []


def test_unsupported_machine_is_reported_once_and_skipped(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, NO_RDT)
    log = RecordingLogger()
    ctl = controller(kernel, procfs, {BE_CG: [5]}, log=log)
    for _ in range(3):
        report = ctl.reconcile({"BE": [BE_CG]})
        assert report.supported is False and "no resctrl filesystem" in report.reason
    assert len(log.named("resctrl_unsupported")) == 1
    assert kernel.ops == []
    assert ctl.status()["supported"] is False


def test_custom_prefix(tmp_path: Path) -> None:
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    controller(kernel, procfs, group_prefix="kn_").reconcile({})
    assert {"kn_LSR", "kn_LS", "kn_BE"} <= {p.name for p in kernel.root.iterdir()}


# ---------------------------------------------------------------------------------------------
# Config and state helpers


def test_class_config_defaults_and_validation() -> None:
    assert resctrl_class_defaults("BE") == ResctrlClassConfig(0, 30, 100)
    assert resctrl_class_defaults("LS") == ResctrlClassConfig(0, 100, 100)
    with pytest.raises(ConfigError, match="cat_range_end_percent: must be greater"):
        from_dict(ResctrlClassConfig, {"cat_range_start_percent": 50, "cat_range_end_percent": 40})
    with pytest.raises(ConfigError, match="mba_percent"):
        from_dict(ResctrlClassConfig, {"mba_percent": 0})
    with pytest.raises(ConfigError, match="group_prefix"):
        from_dict(ResctrlConfig, {"group_prefix": "../x"})
    with pytest.raises(ConfigError, match="vendor"):
        from_dict(ResctrlConfig, {"vendor": "arm"})
    config = from_dict(ResctrlConfig, {"enable": True, "vendor": "amd", "amd_max_bandwidth_gbps": 40})
    assert config.enable and config.amd_max_bandwidth_gbps == 40.0


def _pod(sid: str, qos: str | None, parent: str) -> PodRecord:
    return PodRecord(sid, sid, "default", "uid-" + sid, {}, {}, parent, qos_class=qos)


def _ctr(cid: str, sid: str, state: str = "running") -> ContainerRecord:
    return ContainerRecord(cid, sid, cid, {}, {}, pb.LinuxContainerResources(), state=state)


def test_containers_by_group_from_node_state() -> None:
    state = NodeState()
    state.put_pod(_pod("a", "LSE", "/kubepods/poda"))
    state.put_pod(_pod("b", "BE", "kubepods-besteffort-podb.slice"))
    state.put_pod(_pod("c", "SYSTEM", "/kubepods/podc"))
    state.put_pod(_pod("d", None, "/kubepods/podd"))
    state.put_container(_ctr("a1", "a"))
    state.put_container(_ctr("b1", "b"))
    state.put_container(_ctr("b2", "b", CONTAINER_EXITED))
    state.put_container(_ctr("c1", "c"))
    state.put_container(_ctr("d1", "d"))
    assert containers_by_group(state) == {
        "LSR": ["/kubepods/poda/a1"],
        "BE": ["/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podb.slice/"
               "cri-containerd-b1.scope"],
    }


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_threads_read_through_the_cgroup_executor(tmp_path: Path, version: str) -> None:
    from faketree import make_cgroup_tree, write_cgroup_file

    from koordnode.executor.cgroup_executor import CgroupExecutor

    cgroups = make_cgroup_tree(tmp_path, version, cgroups=[BE_CG])
    # v1 lists a cgroup's threads in "tasks", v2 in "cgroup.threads".
    write_cgroup_file(cgroups, BE_CG, "tasks" if version == "v1" else "cgroup.threads",
                      "200\n201\n", controller="cpu")
    cgroup_executor = CgroupExecutor(cgroups)
    kernel, procfs = make_resctrl(tmp_path, INTEL_XEON_2S)
    kernel.spawn(200, 201)
    config = ResctrlConfig(enable=True, root=str(kernel.root), procfs_root=str(procfs))
    ctl = ResctrlController(config, threads_of=lambda cg: cgroup_executor.read_pids(cg, threads=True),
                            io=kernel, logger=RecordingLogger())
    ctl.reconcile({"BE": [BE_CG, "/kubepods/besteffort/podgone/x"]})
    assert kernel.tasks["koordnode-BE"] == [200, 201]
