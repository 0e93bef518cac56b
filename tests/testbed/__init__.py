"""Real containerd test bed shared by koordnode's end-to-end tests.

Import as ``testbed`` (pytest puts ``tests/`` on sys.path): ``ContainerdBed``
runs a private containerd with the CRI plugin; ``fixtures.containerd_bed`` is
the session-scoped pytest fixture around it.
"""

from .containerd_bed import BedError, ContainerdBed, RuntimeVersion, missing_prerequisites
from .images import BUSYBOX_IMAGE_REF, PAUSE_IMAGE_REF, BuiltImage, build_test_images

__all__ = [
    "BUSYBOX_IMAGE_REF",
    "BedError",
    "BuiltImage",
    "ContainerdBed",
    "PAUSE_IMAGE_REF",
    "RuntimeVersion",
    "build_test_images",
    "missing_prerequisites",
]
