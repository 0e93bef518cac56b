"""Local stand-ins for the images critest (cri-tools) runs, built from the host's busybox.

critest pulls its images from gcr.io and registry.k8s.io, which this machine cannot reach. Before
it pulls an image for a container it asks ``ImageStatus`` and pulls only when the runtime does not
have it, so importing an image under the exact name critest asks for lets every spec that merely
*runs* that image go ahead offline. Each stand-in does what the specs check of the real image:

``CRITEST_BUSYBOX`` (``defaultTestContainerImage`` of ``--test-images-file``)
    busybox with its applets as *hard links*, as in the real busybox image: the MaskedPaths spec
    masks ``/bin/ls``, and with symbolic links that masks ``/bin/busybox`` itself, so no
    container of that spec can start. It adds ``pgrep`` (the execSync-timeout spec runs
    ``pgrep sleep``) and ``ipcs`` (the HostIpc specs run ``ipcs -m``), which the host's busybox
    lacks, as small shell scripts reading /proc.
nginx ``registry.k8s.io/e2e-test-images/nginx:1.14-2`` (also ``webServerTestImage``)
    a process named ``nginx`` whose command line says ``master process``, writing
    ``/var/run/nginx.pid`` and serving ``/`` with HTTP 200 on port 80 (busybox ``httpd``): the
    networking, port-forward and PID-namespace specs.
httpd ``registry.k8s.io/e2e-test-images/httpd:2.4.39-4``
    HTTP on port 80, and a log line naming httpd: the multi-container specs.
hostnet nginx ``gcr.io/k8s-staging-cri-tools/hostnet-nginx-amd64:latest``
    HTTP on port 12003 (the port-forward-in-host-network spec).
predefined group ``gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest``
    user ``default-user`` (uid 1000) in group 50000 of ``/etc/group``: the
    SupplementalGroupsPolicy specs.

pause ``CRITEST_PAUSE`` (the beds' sandbox image for critest)
    the test bed's pause waits in a child named ``sleep``; critest's pods share their PID
    namespace with the sandbox, and the execSync-timeout spec checks that ``pgrep sleep`` finds
    nothing once the timed-out ``sleep`` is gone. This one waits in a child named ``pause``, as
    the real pause is named (busybox's sleep run from a hard link called ``/bin/pause``).

Not stood in: images whose specs exercise ``PullImage`` itself (those always contact the
registry) and ``nonewprivs:1.3``, whose point is a setuid binary.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from .images import DEFAULT_BUSYBOX, BuiltImage, ImageBuildError, build_image_archive, list_applets, oci

CRITEST_BUSYBOX = "docker.io/koordnode/critest-busybox:test"
CRITEST_PAUSE = "docker.io/koordnode/critest-pause:test"
NGINX = "registry.k8s.io/e2e-test-images/nginx:1.14-2"
HTTPD = "registry.k8s.io/e2e-test-images/httpd:2.4.39-4"
HOSTNET_NGINX = "gcr.io/k8s-staging-cri-tools/hostnet-nginx-amd64:latest"
PREDEFINED_GROUP = "gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest"

_IDLE = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"

_SCRIPTS = {
    # pgrep PATTERN: pids whose process name contains PATTERN; status 1 when there is none.
    "usr/bin/pgrep": """#!/bin/sh
found=1
for dir in /proc/[0-9]*; do
  read -r comm < "$dir/comm" 2>/dev/null || continue
  case "$comm" in *"$1"*) echo "${dir#/proc/}"; found=0;; esac
done
exit $found
""",
    # ipcs -m: the System V shared memory segments of this IPC namespace (shmid in column 2).
    "usr/bin/ipcs": """#!/bin/sh
echo "------ Shared Memory Segments --------"
cat /proc/sysvipc/shm
""",
    # nginx stand-in: stays the container's first process (named nginx), serves :80 through httpd.
    "usr/sbin/nginx": f"""#!/bin/sh
echo $$ > /var/run/nginx.pid
httpd -p 80 -h /www
echo "nginx stand-in: master process $$ serving :80"
{_IDLE}
""",
    "usr/local/bin/httpd-foreground": """#!/bin/sh
echo "httpd stand-in: serving :80"
exec httpd -f -v -p 80 -h /www
""",
    "usr/local/bin/hostnet-nginx": """#!/bin/sh
echo "hostnet nginx stand-in: serving :12003"
exec httpd -f -v -p 12003 -h /www
""",
}

_FILES = {
    "www/index.html": "<html><body>koordnode critest stand-in</body></html>\n",
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\n"
                  "default-user:x:1000:1000:default-user:/home/default-user:/bin/sh\n"
                  "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    "etc/group": "root:x:0:\ndefault-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\nnogroup:x:65534:\n",
}

_DIRS = ("bin", "dev", "etc", "home", "home/default-user", "proc", "root", "run", "sbin", "sys", "tmp", "usr",
         "usr/bin", "usr/sbin", "usr/local", "usr/local/bin", "var", "var/run", "var/tmp", "www")


@dataclass(frozen=True)
class StandIn:
    ref: str
    cmd: tuple[str, ...]


# The bed's PAUSE_CMD, with the waiting child named "pause" (argv[0] "sleep" selects the applet).
_PAUSE_CMD = ("/bin/sh", "-c", "trap 'kill $! 2>/dev/null; exit 0' TERM INT HUP; "
              "while :; do (exec -a sleep /bin/pause 2147483647) & wait $!; done")

STAND_INS = (
    StandIn(CRITEST_PAUSE, _PAUSE_CMD),
    StandIn(CRITEST_BUSYBOX, ("/bin/sh",)),
    StandIn(NGINX, ("/usr/sbin/nginx", "-g", "daemon off; master process")),
    StandIn(HTTPD, ("/usr/local/bin/httpd-foreground",)),
    StandIn(HOSTNET_NGINX, ("/usr/local/bin/hostnet-nginx",)),
    StandIn(PREDEFINED_GROUP, ("/bin/sh",)),
)


def build_critest_layer(busybox: Path = DEFAULT_BUSYBOX) -> bytes:
    """One uncompressed layer for every stand-in: busybox, hard-linked applets, the scripts above."""
    if not busybox.is_file():
        raise ImageBuildError(f"busybox binary not found at {busybox} (install busybox-static)")
    binary = busybox.read_bytes()
    applets = [a for a in list_applets(busybox) if a not in _SCRIPTS]
    dirs = set(_DIRS) | {a.rsplit("/", 1)[0] for a in applets if "/" in a}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(dirs):
            mode = 0o1777 if name in ("tmp", "var/tmp") else 0o755
            tar.addfile(oci.tar_info(name + "/", tarfile.DIRTYPE, mode))
        tar.addfile(oci.tar_info("bin/busybox", tarfile.REGTYPE, 0o755, len(binary)), io.BytesIO(binary))
        for applet in [*applets, "bin/pause"]:
            tar.addfile(oci.tar_info(applet, tarfile.LNKTYPE, 0o755, linkname="bin/busybox"))
        for name, text in sorted(_FILES.items()):
            data = text.encode()
            tar.addfile(oci.tar_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        for name, text in sorted(_SCRIPTS.items()):
            data = text.encode()
            tar.addfile(oci.tar_info(name, tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
    return buf.getvalue()


def build_critest_images(out_dir: Path, busybox: Path = DEFAULT_BUSYBOX) -> list[BuiltImage]:
    """OCI archives of every stand-in in ``out_dir``, sharing one layer (import them with ``ctr``)."""
    layer = build_critest_layer(busybox)
    return [
        build_image_archive(out_dir / f"critest-{i}.oci.tar", image.ref, list(image.cmd), layer=layer)
        for i, image in enumerate(STAND_INS)
    ]
