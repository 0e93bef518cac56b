"""The ``koordnode`` command: run the daemon, check the config, show status and versions.

Exit codes: 0 success, 1 runtime failure, 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from koordnode import __version__
from koordnode.config import (
    DEFAULT_CONFIG_PATH,
    AdminConfig,
    Config,
    ConfigError,
    LogConfig,
    LogFormat,
    LogLevel,
    ProxyConfig,
    load_config,
    to_dict,
    to_toml,
    unix_socket_path,
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

_DEFAULT_PROXY = ProxyConfig()
_DEFAULT_LOG = LogConfig()

_DESCRIPTION = """\
koordnode: node-local QoS daemon for Kubernetes colocation.

A CRI proxy between kubelet and containerd that applies cgroup settings per QoS class
(SYSTEM, LSE, LSR, LS, BE) when pods and containers are created. Hooks fail open: if one
fails or is too slow, the original request goes to the runtime unchanged.
"""

_EPILOG = f"""\
configuration:
  TOML, by default {DEFAULT_CONFIG_PATH}; if that file does not exist,
  built-in defaults apply. A path given with --config must exist. Every key, its default
  and unit are listed in the example koordnode.toml shipped with the package.

exit codes:
  0 success, 1 runtime failure, 2 usage or configuration error

examples:
  koordnode check-config --config /etc/koordnode/koordnode.toml
  koordnode run --backend unix:///run/containerd/containerd.sock
  kubelet --container-runtime-endpoint=unix://{_DEFAULT_PROXY.listen}

Run `koordnode <command> --help` for the options of a command.
"""


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"TOML config file (default: {DEFAULT_CONFIG_PATH}; built-in defaults apply "
        "when that file does not exist, but a file named here must exist)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="koordnode",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"koordnode {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    run = commands.add_parser(
        "run",
        help="serve CRI on the listen socket and forward calls to the backend runtime",
        description="Serve CRI on the listen socket and forward every call to the backend "
        "runtime, running the QoS hooks on the calls they intercept. Stops on SIGTERM or "
        "SIGINT after finishing in-flight calls. Config errors are printed and exit with 2.",
    )
    _add_config_option(run)
    run.add_argument(
        "--listen",
        metavar="PATH",
        help="CRI socket to serve, a path or unix://path; overrides [proxy] listen "
        f"(default: {_DEFAULT_PROXY.listen})",
    )
    run.add_argument(
        "--backend",
        metavar="PATH",
        help="CRI socket of the container runtime, a path or unix://path; overrides "
        f"[proxy] backend (default: {_DEFAULT_PROXY.backend})",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="decide, log, count and report everything but write nothing to the kernel and "
        "forward every CRI request unchanged; sets [daemon] dry_run = true",
    )
    run.add_argument(
        "--log-level",
        choices=typing.get_args(LogLevel),
        help=f"overrides [log] level (default: {_DEFAULT_LOG.level})",
    )
    run.add_argument(
        "--log-format",
        choices=typing.get_args(LogFormat),
        help=f"overrides [log] format (default: {_DEFAULT_LOG.format})",
    )
    run.set_defaults(handler=_cmd_run)

    check = commands.add_parser(
        "check-config",
        help="validate the config file and print the effective configuration",
        description="Validate the config file. On success print 'config OK: <source>' and "
        "the effective configuration (defaults filled in) and exit 0; otherwise print "
        "every error with its key path to stderr and exit 2.",
    )
    _add_config_option(check)
    check.add_argument(
        "--json", action="store_true", help="print the effective configuration as JSON"
    )
    check.set_defaults(handler=_cmd_check_config)

    status = commands.add_parser(
        "status",
        help="ask the running daemon for pods, classes and applied values (root)",
        description="Query the running daemon on its admin socket ([admin] socket) and print "
        "every pod with its QoS class, why, and the values applied and last verified.",
    )
    _add_config_option(status)
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.add_argument(
        "--ready", action="store_true",
        help="only say whether the daemon can do its work (NRI: registered and synchronized with the "
        "runtime; proxy: the runtime answers and the pods are rebuilt): exit 0 ready, 1 not (a "
        "readiness probe)",
    )
    status.add_argument(
        "--socket", metavar="PATH",
        help="admin socket to ask (default: [admin] socket of the config file; if that file "
        "is broken, its [admin] socket if readable, else the built-in default)",
    )
    status.set_defaults(handler=_cmd_status)

    top = commands.add_parser(
        "top",
        help="watch this node live: CPU, pressure, memory per class and pod, the BE budget, decisions (root)",
        description="A live view of this node, refreshed every --interval seconds from the running "
        "daemon's admin socket and the cgroups it names: CPU use, throttling and CPU pressure per "
        "class and per pod, memory use against memory.min/low/high, the BE budget with its "
        "inputs, the BE group's state, recent decisions with their reasons, overwrites restored, "
        "hook timeouts. Keys: s sort, c class filter, / text filter, r refresh, q quit.",
    )
    _add_config_option(top)
    top.add_argument("--once", action="store_true",
                     help="print one snapshot as plain text and exit (takes one --interval)")
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                     help="seconds between refreshes (default 1)")
    top.add_argument("--sort", choices=("cpu", "memory", "throttled", "pressure", "name", "class"),
                     default="cpu", help="pod order (default cpu)")
    top.add_argument("--class", dest="qos_class", choices=("all", "SYSTEM", "LSE", "LSR", "LS", "BE"),
                     default="all", help="only pods of this class (default all)")
    top.add_argument("--socket", metavar="PATH",
                     help="admin socket to ask (default: [admin] socket of the config file)")
    top.set_defaults(handler=_cmd_top)

    doctor = commands.add_parser(
        "doctor",
        help="check this node for koordnode: cgroups, drivers, containerd, kubelet, kernel features",
        description="Check what this node offers koordnode and what it will do here: cgroup "
        "version and drivers (containerd, kubelet, koordnode), kubelet's runtime endpoint, "
        "containerd's socket and version, NRI, PSI and 500 ms triggers, cpu.idle, CPU burst, "
        "io.max, group identity, core scheduling, resctrl, nftables, the sysctls koordnode may write; then the "
        "features that will be active or degraded, with the reason. Each line is OK, WARN or "
        "FAIL with what to do. Exit 0: all OK, 1: warnings, 2: failures (or a bad config).",
    )
    _add_config_option(doctor)
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument(
        "--containerd-config", metavar="PATH", default=None,
        help="containerd's config file (default: /etc/containerd/config.toml)",
    )
    doctor.add_argument(
        "--kubelet-config", metavar="PATH", default=None,
        help="kubelet's KubeletConfiguration file (default: /var/lib/kubelet/config.yaml)",
    )
    doctor.add_argument(
        "--kubelet-flags", metavar="PATH", action="append", default=None,
        help="a file with kubelet's command-line flags; repeatable (default: "
        "/var/lib/kubelet/kubeadm-flags.env, /etc/default/kubelet, /etc/sysconfig/kubelet)",
    )
    doctor.set_defaults(handler=_cmd_doctor)

    restore = commands.add_parser(
        "restore",
        help="put the node-level values koordnode changed back to their originals (root)",
        description="Return the node to the originals koordnode kept before its first write "
        "([daemon] state_dir, originals.json): sysctls, the files of non-pod cgroups (the BE "
        "tier's quota, the BE group's cpuset and memory bounds), and removes the cgroups, resctrl "
        "groups, root qdiscs and nftables table that were absent before. Prints one line per "
        "target. Refuses while koordnode runs (it would set its values again: stop it first). "
        "Exit 0: all restored, 1: something stayed (the line says why; run again after fixing "
        "it), 2: a bad config or state file.",
    )
    _add_config_option(restore)
    restore.add_argument("--dry-run", action="store_true",
                         help="list what would be restored and change nothing (also while koordnode runs)")
    restore.add_argument("--json", action="store_true", help="print the report as JSON")
    restore.set_defaults(handler=_cmd_restore)

    version = commands.add_parser(
        "version",
        help="print the koordnode, Python, h2 and protobuf versions",
        description="Print the koordnode version and those of Python, h2, protobuf and structlog.",
    )
    version.set_defaults(handler=_cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command == "run":  # the daemon: its own errors are its own to report
        return int(args.handler(args))
    try:
        return int(args.handler(args))
    except BrokenPipeError:
        # The reader of a command's output went away (`koordnode check-config | head`): no
        # traceback; stdout is pointed at /dev/null so the interpreter's final flush is quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_FAILURE


# ---------------------------------------------------------------------------------------------
# Commands


def _cmd_version(_args: argparse.Namespace) -> int:
    print(f"koordnode {__version__}")
    print(f"python {platform.python_version()} ({platform.python_implementation()})")
    for dist in ("h2", "protobuf", "structlog"):
        print(f"{dist} {_dist_version(dist)}")
    return EXIT_OK


def _cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return EXIT_USAGE
    if config.uses_defaults:
        print(f"config OK: {config.source} ({DEFAULT_CONFIG_PATH} not found; built-in defaults)")
    else:
        print(f"config OK: {config.source}")
    if args.json:
        print(json.dumps(to_dict(config), indent=2))
    else:
        print(to_toml(config), end="")
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    overrides = {
        "proxy": {"listen": args.listen, "backend": args.backend},
        "log": {"level": args.log_level, "format": args.log_format},
    }
    if args.dry_run:
        overrides["daemon"] = {"dry_run": True}
    config = _load(args.config, overrides)
    if config is None:
        return EXIT_USAGE
    if not config.kubernetes.enable:
        from koordnode.tls_modules import leave_tls_out

        leave_tls_out()
    # Imported here so that the rest of the CLI works without the daemon's dependencies.
    from koordnode.logsetup import configure_logging, get_logger

    configure_logging(config.log.level, config.log.format)
    get_logger("koordnode.cli").info(
        "config_loaded", source=config.source, listen=config.proxy.listen,
        backend=config.proxy.backend,
    )
    daemon = _optional_module("koordnode.daemon")
    if daemon is None:
        print("koordnode run: the daemon (koordnode.daemon) is not available in this build",
              file=sys.stderr)
        return EXIT_FAILURE
    return int(daemon.run(config))


def _cmd_doctor(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return EXIT_USAGE
    from koordnode.doctor import report as doctor_report
    from koordnode.doctor.run import run_doctor

    paths = doctor_report.DoctorPaths(
        cgroup_root=config.cgroup.root, procfs_root=config.procfs.root,
        sysfs_root=config.sysfs.root, resctrl_root=config.resctrl.root,
        containerd_config=args.containerd_config or doctor_report.DEFAULT_CONTAINERD_CONFIG,
        kubelet_config=args.kubelet_config or doctor_report.DEFAULT_KUBELET_CONFIG,
        kubelet_flags=tuple(args.kubelet_flags) if args.kubelet_flags else doctor_report.DEFAULT_KUBELET_FLAGS,
    )
    report = run_doctor(config, paths)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        print(doctor_report.render_text(report), end="")
    return report.exit_code


def _cmd_restore(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return EXIT_USAGE
    from koordnode.executor.originals import OriginalsJournal
    from koordnode.executor.restore import RestoreRoots, restore
    from koordnode.nodelock import NodeLock, NodeLockError, lock_path

    lock = NodeLock(lock_path(config.admin.socket))
    if not args.dry_run:
        try:
            lock.acquire("restore", "koordnode restore")
        except NodeLockError as exc:
            print(f"koordnode restore: koordnode is running and would set its values again: stop it "
                  f"first (systemctl stop koordnode), or use --dry-run. {exc}", file=sys.stderr)
            return EXIT_FAILURE
        except OSError as exc:
            print(f"koordnode restore: cannot take the node lock: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    try:
        roots = RestoreRoots(cgroup=config.cgroup.root, procfs=config.procfs.root, resctrl=config.resctrl.root,
                             resctrl_prefix=config.resctrl.group_prefix)
        report = restore(OriginalsJournal(config.daemon.state_dir), roots, dry_run=args.dry_run)
    finally:
        lock.release()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.text(), end="", file=sys.stderr if report.error and not report.actions else sys.stdout)
    if report.error is not None and not report.actions:
        return EXIT_USAGE  # the state file itself: nothing was touched
    return EXIT_OK if report.ok else EXIT_FAILURE


def _cmd_status(args: argparse.Namespace) -> int:
    client = _optional_module("koordnode.admin.client")
    if client is None:
        print("koordnode status: not available in this build (koordnode.admin.client is "
              "missing)", file=sys.stderr)
        return EXIT_FAILURE
    if args.socket:
        try:
            path = unix_socket_path(args.socket)
        except ValueError as exc:
            print(f"koordnode status: --socket: {exc}", file=sys.stderr)
            return EXIT_USAGE
        return int(client.status_command_for(path, as_json=args.json, ready=args.ready))
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        # A broken file is when the operator needs status most: the admin socket is all this
        # command needs, so ask the running daemon anyway and say which socket was used.
        path, where = _admin_socket_despite(args.config or DEFAULT_CONFIG_PATH)
        print(f"koordnode status: the config file has errors (`koordnode check-config` lists them;"
              f" the running daemon keeps its last good config): {exc}", file=sys.stderr)
        print(f"koordnode status: asking the admin socket {path} ({where})", file=sys.stderr)
        return int(client.status_command_for(path, as_json=args.json, ready=args.ready))
    return int(client.status_command(config, as_json=args.json, ready=args.ready))


def _cmd_top(args: argparse.Namespace) -> int:
    if not 0.1 <= args.interval <= 60:
        print("koordnode top: --interval: expected seconds in [0.1, 60]", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"koordnode top: the config file has errors (`koordnode check-config` lists them): {exc}",
              file=sys.stderr)
        return EXIT_USAGE
    path = config.admin.socket
    if args.socket:
        try:
            path = unix_socket_path(args.socket)
        except ValueError as exc:
            print(f"koordnode top: --socket: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from koordnode.admin import top

    view = top.View(sort=args.sort, qos_class=args.qos_class)
    return top.top_command(path, config.cgroup.root, config.procfs.root, once=args.once,
                           interval_s=args.interval, view=view)


def _admin_socket_despite(path: str) -> tuple[str, str]:
    """[admin] socket of a config file that does not validate, and where it came from."""
    default = AdminConfig().socket
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")[:1 << 20]
    except OSError:
        return default, f"the built-in default: {path} cannot be read"
    import tomllib

    try:
        value = tomllib.loads(text).get("admin", {}).get("socket")
    except (tomllib.TOMLDecodeError, AttributeError):
        # Not even TOML: the [admin] table's `socket = "..."` line, if there is one.
        value = _scan_admin_socket(text)
    if value is None:
        return default, f"the built-in default: {path} sets no readable [admin] socket"
    try:
        return unix_socket_path(str(value)), f"[admin] socket of {path}"
    except ValueError:
        return default, f"the built-in default: the [admin] socket of {path} is not a socket path"


def _scan_admin_socket(text: str) -> str | None:
    table = ""
    for line in text.splitlines():
        header = re.match(r"\s*\[([^\[\]]+)\]\s*(#.*)?$", line)
        if header:
            table = header.group(1).strip()
            continue
        found = re.match(r'\s*socket\s*=\s*"([^"\\]*)"\s*(#.*)?$', line)
        if table == "admin" and found:
            return found.group(1)
    return None


# ---------------------------------------------------------------------------------------------
# Helpers


def _load(path: str | None, overrides: dict[str, Any] | None = None) -> Config | None:
    """Load the config, or print every error to stderr and return None."""
    try:
        return load_config(path, overrides=overrides)
    except ConfigError as exc:
        print(f"koordnode: {exc}", file=sys.stderr)
        return None


def _optional_module(name: str) -> Any:
    """Import ``name``; None only if that module (or its package) does not exist.

    An ImportError raised *inside* an existing module is a bug and propagates.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise


def _dist_version(dist: str) -> str:
    # Imported here: only `version` needs it, and it would stay in the daemon's memory.
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
