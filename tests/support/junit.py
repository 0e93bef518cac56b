"""What a junit file says of each test case, for the tests of the VM lane's result handling."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(junit: Path) -> dict[str, str]:
    """Each case's name -> "passed", "failure", "error" or "skipped"."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kind = next((k for k in ("failure", "error", "skipped") if case.find(k) is not None), "passed")
        found[case.get("name", "")] = kind
    return found
