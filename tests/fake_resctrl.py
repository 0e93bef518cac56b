"""A fake resctrl mount (and cpuinfo) laid out like the kernel's, with a model of its rules.

The tree is made of plain files and directories, named and filled as Linux shows them
(Documentation/arch/x86/resctrl.rst, arch/x86/kernel/cpu/resctrl): the root group with
``cpus``, ``cpus_list``, ``mode``, ``schemata``, ``size``, ``tasks``, ``mon_data/``,
``mon_groups/``, and ``info/`` with ``last_cmd_status``, ``L3/`` (``bit_usage``,
``cbm_mask``, ``min_cbm_bits``, ``num_closids``, ``shareable_bits``, ``sparse_masks``),
``MB/`` (``bandwidth_gran``, ``delay_linear``, ``min_bandwidth``, ``num_closids``, and on
Intel ``thread_throttle_mode``) and ``L3_MON/``.

Plain files cannot behave like kernfs, so :class:`FakeResctrlKernel` is passed to the code
under test as its ResctrlIO and applies the kernel's rules on every operation:

- schemata writes must end in a newline; each line updates only the domains it names
  (partial writes); masks must be contiguous, inside cbm_mask, with min_cbm_bits bits; Intel
  MB values are refused below min_bandwidth or above 100 and rounded up to bandwidth_gran;
  AMD MB values must be 0..2048. A refused write raises EINVAL and sets
  info/last_cmd_status. The file is then re-rendered as the kernel prints it: names padded
  to the longest resource name, values padded to the widest data width (``%0*x`` for masks,
  ``%*u`` for MB), e.g. AMD ``MB:0=2048;1=  16``.
- tasks writes take one thread id, ESRCH for an unknown thread, and move it out of every
  other group;
- mkdir makes a group with the default values (full masks, unlimited MB) unless the CLOSIDs
  are used up (ENOSPC); rmdir hands the group's tasks to the root group.

Every operation is recorded in ``kernel.ops`` so tests can check what was (not) written.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

# Flags of real machines (trimmed of nothing relevant): the resctrl ones are rdt_a, cat_l3,
# cdp_l3, mba, cqm_*.
_INTEL_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi "
    "mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon "
    "pebs bts rep_good nopl xtopology nonstop_tsc cpuid aperfmperf pni pclmulqdq dtes64 monitor "
    "ds_cpl vmx smx est tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid dca sse4_1 sse4_2 x2apic movbe "
    "popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm abm 3dnowprefetch cpuid_fault "
    "epb cat_l3 cdp_l3 invpcid_single pti intel_ppin ssbd mba ibrs ibpb stibp tpr_shadow vnmi "
    "flexpriority ept vpid ept_ad fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm "
    "cqm mpx rdt_a avx512f avx512dq rdseed adx smap clflushopt clwb intel_pt avx512cd avx512bw "
    "avx512vl xsaveopt xsavec xgetbv1 xsaves cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local "
    "dtherm ida arat pln pts pku ospke md_clear flush_l1d arch_capabilities"
)
_AMD_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl "
    "nonstop_tsc cpuid extd_apicid aperfmperf rapl pni pclmulqdq monitor ssse3 fma cx16 pcid "
    "sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand lahf_lm cmp_legacy svm "
    "extapic cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw ibs skinit wdt tce topoext "
    "perfctr_core perfctr_nb bpext perfctr_llc mwaitx cpb cat_l3 cdp_l3 invpcid_single hw_pstate "
    "ssbd mba ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep bmi2 erms invpcid cqm rdt_a "
    "rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves cqm_llc "
    "cqm_occup_llc cqm_mbm_total cqm_mbm_local clzero irperf xsaveerptr rdpru wbnoinvd amd_ppin "
    "arat npt lbrv svm_lock nrip_save tsc_scale vmcb_clean flushbyasid decodeassists "
    "pausefilter pfthreshold v_vmsave_vmload vgif v_spec_ctrl umip pku ospke vaes vpclmulqdq "
    "rdpid overflow_recov succor smca"
)
# A machine whose CPU has no resctrl allocation at all (like this test machine).
_PLAIN_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov sse sse2 ht syscall nx lm"


@dataclass(frozen=True)
class MBSpec:
    min_bandwidth: int
    bandwidth_gran: int
    delay_linear: int
    num_closids: int
    amd: bool = False
    thread_throttle_mode: str = "max"


@dataclass(frozen=True)
class Machine:
    vendor_id: str
    model_name: str
    flags: str
    cpus: int
    cache_ids: tuple[int, ...]  # L3 cache ids, possibly sparse
    cbm_mask: int | None  # None: no L3 allocation
    min_cbm_bits: int = 1
    l3_num_closids: int = 16
    mb: MBSpec | None = None
    cache_size_kib: int = 28160  # per L3 domain, for the "size" file
    cdp: bool = False  # mounted with -o cdp: L3DATA and L3CODE instead of L3

    @property
    def cache_resources(self) -> list[str]:
        if self.cbm_mask is None:
            return []
        return ["L3DATA", "L3CODE"] if self.cdp else ["L3"]


INTEL_XEON_2S = Machine(
    vendor_id="GenuineIntel",
    model_name="Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz",
    flags=_INTEL_FLAGS,
    cpus=80,
    cache_ids=(0, 1),
    cbm_mask=0x7FF,
    min_cbm_bits=1,
    l3_num_closids=16,
    mb=MBSpec(min_bandwidth=10, bandwidth_gran=10, delay_linear=1, num_closids=8),
    cache_size_kib=28160,
)

AMD_EPYC_16CCD = Machine(
    vendor_id="AuthenticAMD",
    model_name="AMD EPYC 7763 64-Core Processor",
    flags=_AMD_FLAGS,
    cpus=256,
    cache_ids=tuple(range(16)),
    cbm_mask=0xFFFF,
    min_cbm_bits=0,  # AMD allows empty bitmaps
    l3_num_closids=16,
    mb=MBSpec(min_bandwidth=0, bandwidth_gran=1, delay_linear=0, num_closids=16, amd=True),
    cache_size_kib=32768,
)

# One socket offline (or a sub-NUMA layout): cache ids 0 and 2 only.
INTEL_SPARSE_IDS = Machine(
    vendor_id="GenuineIntel",
    model_name="Intel(R) Xeon(R) Platinum 8260 CPU @ 2.40GHz",
    flags=_INTEL_FLAGS,
    cpus=48,
    cache_ids=(0, 2),
    cbm_mask=0x7FF,
    min_cbm_bits=1,
    mb=MBSpec(min_bandwidth=10, bandwidth_gran=10, delay_linear=1, num_closids=8),
)

# L3 CAT but no MBA (e.g. Broadwell): no MB line, no info/MB, no "mba" flag.
INTEL_L3_ONLY = Machine(
    vendor_id="GenuineIntel",
    model_name="Intel(R) Xeon(R) CPU E5-2699 v4 @ 2.20GHz",
    flags=_INTEL_FLAGS.replace(" mba", ""),
    cpus=88,
    cache_ids=(0, 1),
    cbm_mask=0xFFFFF,
    min_cbm_bits=1,
    mb=None,
    cache_size_kib=56320,
)

NO_RDT = Machine(
    vendor_id="AuthenticAMD",
    model_name="AMD EPYC Processor",
    flags=_PLAIN_FLAGS,
    cpus=2,
    cache_ids=(),
    cbm_mask=None,
)


def write_cpuinfo(procfs: Path, machine: Machine, processors: int = 4) -> Path:
    """A /proc/cpuinfo with a few processor blocks (as many as needed to look real)."""
    procfs.mkdir(parents=True, exist_ok=True)
    blocks = []
    for n in range(min(processors, machine.cpus)):
        blocks.append(
            f"processor\t: {n}\n"
            f"vendor_id\t: {machine.vendor_id}\n"
            "cpu family\t: 6\n"
            f"model name\t: {machine.model_name}\n"
            "stepping\t: 4\n"
            f"physical id\t: 0\n"
            f"flags\t\t: {machine.flags}\n"
            "bogomips\t: 4800.00\n"
        )
    path = procfs / "cpuinfo"
    path.write_text("\n".join(blocks) + "\n")
    return path


def _cbm_len(mask: int) -> int:
    return mask.bit_length()


@dataclass
class FakeResctrlKernel:
    """The resctrl tree at ``root`` plus the kernel's rules (a ResctrlIO for the code)."""

    root: Path
    machine: Machine
    live_threads: set[int] = field(default_factory=set)
    ops: list[tuple[str, str, str]] = field(default_factory=list)  # (op, relative path, text)
    # group name ("" = root) -> resource -> {domain: value}
    values: dict[str, dict[str, dict[int, int]]] = field(default_factory=dict)
    tasks: dict[str, list[int]] = field(default_factory=dict)

    # ---------------------------------------------------------------- layout

    @property
    def resources(self) -> list[str]:
        out = list(self.machine.cache_resources)
        if self.machine.mb is not None:
            out.append("MB")
        # AMD kernels list MB before L3 (as the documentation's AMD examples show).
        if self.machine.mb is not None and self.machine.mb.amd:
            out.sort(key=lambda r: r != "MB")
        return out

    def defaults(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for resource in self.resources:
            if resource != "MB":
                out[resource] = {i: self.machine.cbm_mask for i in self.machine.cache_ids}  # type: ignore[misc]
            else:
                assert self.machine.mb is not None
                full = 2048 if self.machine.mb.amd else 100
                out["MB"] = {i: full for i in self.machine.cache_ids}
        return out

    def _data_width(self) -> int:
        widths = []
        if self.machine.cbm_mask is not None:
            widths.append((_cbm_len(self.machine.cbm_mask) + 3) // 4)
        if self.machine.mb is not None:
            widths.append(4 if self.machine.mb.amd else 3)
        return max(widths, default=0)

    def render(self, group: str) -> str:
        name_width = max((len(r) for r in self.resources), default=0)
        width = self._data_width()
        lines = []
        for resource in self.resources:
            doms = self.values[group][resource]
            if resource == "MB":
                items = ";".join(f"{d}={v:>{width}d}" for d, v in doms.items())
            else:
                items = ";".join(f"{d}={v:0{width}x}" for d, v in doms.items())
            lines.append(f"{resource:>{name_width}}:{items}\n")
        return "".join(lines)

    def _size_text(self, group: str) -> str:
        lines = []
        name_width = max((len(r) for r in self.resources), default=0)
        for resource in self.resources:
            doms = self.values[group][resource]
            if resource == "MB":
                items = ";".join(f"{d}={v}" for d, v in doms.items())
            else:
                assert self.machine.cbm_mask is not None
                per_bit = self.machine.cache_size_kib * 1024 // _cbm_len(self.machine.cbm_mask)
                items = ";".join(f"{d}={v.bit_count() * per_bit}" for d, v in doms.items())
            lines.append(f"{resource:>{name_width}}:{items}\n")
        return "".join(lines)

    def _group_files(self, directory: Path, group: str) -> None:
        cpumask_words = (self.machine.cpus + 31) // 32
        cpus = ",".join(["00000000"] * cpumask_words)
        (directory / "cpus").write_text(cpus + "\n")
        (directory / "cpus_list").write_text("\n")
        (directory / "mode").write_text("shareable\n")
        (directory / "mon_groups").mkdir()
        mon_data = directory / "mon_data"
        mon_data.mkdir()
        for cache_id in self.machine.cache_ids:
            dom = mon_data / f"mon_L3_{cache_id:02d}"
            dom.mkdir()
            for event in ("llc_occupancy", "mbm_local_bytes", "mbm_total_bytes"):
                (dom / event).write_text("0\n")
        self._sync_files(group)

    def _sync_files(self, group: str) -> None:
        directory = self.root / group if group else self.root
        (directory / "schemata").write_text(self.render(group))
        (directory / "size").write_text(self._size_text(group))
        (directory / "tasks").write_text("".join(f"{t}\n" for t in self.tasks[group]))

    def build(self, root_tasks: tuple[int, ...] = (1,)) -> FakeResctrlKernel:
        root = self.root
        root.mkdir(parents=True, exist_ok=True)
        self.values[""] = self.defaults()
        self.tasks[""] = sorted(set(root_tasks))
        self.live_threads.update(root_tasks)
        info = root / "info"
        info.mkdir()
        (info / "last_cmd_status").write_text("ok\n")
        m = self.machine
        for resource in m.cache_resources:
            assert m.cbm_mask is not None
            l3 = info / resource
            l3.mkdir()
            (l3 / "bit_usage").write_text(
                ";".join(f"{i}=" + "X" * _cbm_len(m.cbm_mask) for i in m.cache_ids) + "\n")
            (l3 / "cbm_mask").write_text(f"{m.cbm_mask:x}\n")
            (l3 / "min_cbm_bits").write_text(f"{m.min_cbm_bits}\n")
            # CDP uses two CLOSIDs per group.
            (l3 / "num_closids").write_text(f"{m.l3_num_closids // (2 if m.cdp else 1)}\n")
            (l3 / "shareable_bits").write_text("0\n")
            (l3 / "sparse_masks").write_text("0\n")
        if m.cbm_mask is not None:
            mon = info / "L3_MON"
            mon.mkdir()
            (mon / "max_threshold_occupancy").write_text("1441792\n")
            (mon / "mon_features").write_text("llc_occupancy\nmbm_total_bytes\nmbm_local_bytes\n")
            (mon / "num_rmids").write_text("224\n")
        if m.mb is not None:
            mb = info / "MB"
            mb.mkdir()
            (mb / "bandwidth_gran").write_text(f"{m.mb.bandwidth_gran}\n")
            (mb / "delay_linear").write_text(f"{m.mb.delay_linear}\n")
            (mb / "min_bandwidth").write_text(f"{m.mb.min_bandwidth}\n")
            (mb / "num_closids").write_text(f"{m.mb.num_closids}\n")
            if not m.mb.amd:
                (mb / "thread_throttle_mode").write_text(f"{m.mb.thread_throttle_mode}\n")
        self._group_files(root, "")
        (root / "cpus_list").write_text(f"0-{m.cpus - 1}\n")
        return self

    # ---------------------------------------------------------------- helpers for tests

    def group_dir(self, group: str) -> Path:
        return self.root / group if group else self.root

    def schemata(self, group: str) -> str:
        return (self.group_dir(group) / "schemata").read_text()

    def set_values(self, group: str, resource: str, domains: dict[int, int]) -> None:
        """Change values behind the daemon's back (e.g. an operator's echo)."""
        self.values[group][resource].update(domains)
        self._sync_files(group)

    def spawn(self, *tids: int, group: str = "") -> None:
        """Threads that exist (in ``group``, the root by default)."""
        self.live_threads.update(tids)
        for tid in tids:
            self._move(tid, group)

    def exit(self, *tids: int) -> None:
        for tid in tids:
            self.live_threads.discard(tid)
            for group, members in self.tasks.items():
                if tid in members:
                    members.remove(tid)
                    self._sync_files(group)

    def writes(self, name: str | None = None) -> list[tuple[str, str]]:
        """(relative path, text) of every write, optionally only to files called ``name``."""
        return [(path, text) for op, path, text in self.ops
                if op == "write" and (name is None or path.rsplit("/", 1)[-1] == name)]

    # ---------------------------------------------------------------- ResctrlIO

    def _group_of(self, path: Path) -> tuple[str, str]:
        rel = Path(os.path.relpath(path, self.root))
        parts = rel.parts
        if len(parts) == 1:
            return "", parts[0]
        if len(parts) == 2 and parts[0] in self.values:
            return parts[0], parts[1]
        return "?", str(rel)

    def _fail(self, message: str, code: int = errno.EINVAL) -> None:
        (self.root / "info" / "last_cmd_status").write_text(message + "\n")
        raise OSError(code, os.strerror(code))

    def read(self, path: Path) -> str:
        return Path(path).read_text()

    def write(self, path: Path, text: str) -> None:
        path = Path(path)
        rel = os.path.relpath(path, self.root)
        self.ops.append(("write", rel, text))
        (self.root / "info" / "last_cmd_status").write_text("ok\n")
        group, name = self._group_of(path)
        if group == "?" or not path.exists():
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        if name == "schemata":
            self._write_schemata(group, text)
        elif name == "tasks":
            self._write_tasks(group, text)
        else:
            path.write_text(text)

    def _write_schemata(self, group: str, text: str) -> None:
        if not text.endswith("\n"):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        staged = {r: dict(d) for r, d in self.values[group].items()}
        for line in text[:-1].split("\n"):
            resource, sep, rest = line.partition(":")
            resource = resource.strip()
            if not sep:
                self._fail("Missing ':'")
            if resource not in staged:
                self._fail(f"Unknown or unsupported resource name '{resource}'")
            for item in rest.strip().split(";"):
                if not item.strip():
                    continue
                dom_text, eq, value_text = item.partition("=")
                if not eq or not dom_text.strip().isdigit():
                    self._fail("Missing '=' or non-numeric domain id")
                dom = int(dom_text)
                if dom not in staged[resource]:
                    self._fail("Missing '=' or non-numeric domain id")
                staged[resource][dom] = self._parse_value(resource, value_text.strip())
        self.values[group] = staged
        self._sync_files(group)

    def _parse_value(self, resource: str, text: str) -> int:
        if resource == "MB":
            mb = self.machine.mb
            assert mb is not None
            if not text.isdigit():
                self._fail(f"Non-decimal digit in MB value {text}")
            value = int(text)
            top = 2048 if mb.amd else 100
            if value < mb.min_bandwidth or value > top:
                self._fail(f"MB value {value} out of range [{mb.min_bandwidth},{top}]")
            if not mb.amd:
                gran = mb.bandwidth_gran
                value = -(-value // gran) * gran
            return value
        try:
            mask = int(text, 16)
        except ValueError:
            self._fail(f"Non-hex character in the mask {text}")
        m = self.machine
        assert m.cbm_mask is not None
        if mask & ~m.cbm_mask:
            self._fail("Mask out of range")
        if mask == 0 and m.min_cbm_bits > 0:
            self._fail(f"Mask {text} has too few bits")
        if mask:
            shifted = mask >> ((mask & -mask).bit_length() - 1)
            if shifted & (shifted + 1):
                self._fail(f"The mask {text} has non-consecutive 1-bits")
        if mask.bit_count() < m.min_cbm_bits:
            self._fail(f"Need at least {m.min_cbm_bits} bits in the mask")
        return mask

    def _write_tasks(self, group: str, text: str) -> None:
        word = text.strip()
        if not word.isdigit():
            self._fail("Task list parsing error")
        tid = int(word)
        if tid not in self.live_threads:
            self._fail(f"No task {tid}", errno.ESRCH)
        self._move(tid, group)

    def _move(self, tid: int, group: str) -> None:
        for name, members in self.tasks.items():
            if tid in members and name != group:
                members.remove(tid)
                self._sync_files(name)
        if tid not in self.tasks[group]:
            self.tasks[group].append(tid)
            self.tasks[group].sort()
        self._sync_files(group)

    def mkdir(self, path: Path) -> None:
        path = Path(path)
        rel = os.path.relpath(path, self.root)
        self.ops.append(("mkdir", rel, ""))
        if "/" in rel:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        if path.exists():
            raise OSError(errno.EEXIST, os.strerror(errno.EEXIST))
        l3_closids = self.machine.l3_num_closids // (2 if self.machine.cdp else 1)
        limit = min([l3_closids if self.machine.cbm_mask is not None else 10**6]
                    + ([self.machine.mb.num_closids] if self.machine.mb else []))
        if len(self.values) >= limit:
            self._fail("Out of CLOSIDs", errno.ENOSPC)
        path.mkdir()
        self.values[rel] = self.defaults()
        self.tasks[rel] = []
        self._group_files(path, rel)

    def rmdir(self, path: Path) -> None:
        path = Path(path)
        rel = os.path.relpath(path, self.root)
        self.ops.append(("rmdir", rel, ""))
        if rel not in self.values or rel == "":
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        for tid in self.tasks.pop(rel):
            self.tasks[""].append(tid)
        self.tasks[""].sort()
        del self.values[rel]
        shutil.rmtree(path)
        self._sync_files("")


def make_resctrl(tmp_path: Path, machine: Machine, *, root_tasks: tuple[int, ...] = (1,)) -> tuple[FakeResctrlKernel, Path]:
    """A fake resctrl mount at tmp_path/resctrl and cpuinfo at tmp_path/proc; (kernel, procfs)."""
    procfs = tmp_path / "proc"
    write_cpuinfo(procfs, machine)
    kernel = FakeResctrlKernel(tmp_path / "resctrl", machine)
    if machine.cbm_mask is None and machine.mb is None:
        (tmp_path / "resctrl").mkdir()
        return kernel, procfs
    kernel.build(root_tasks)
    return kernel, procfs
