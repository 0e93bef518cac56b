"""`koordnode doctor`: what this node offers koordnode, what it will do here, and what to fix.

Run before pointing kubelet at koordnode, and at any time. Every check reads (the kernel's
files, containerd's and kubelet's configs, containerd's Version call); the only thing it
creates is a PSI trigger, to learn whether the kernel accepts a 500 ms window, closed at once.

Each check ends OK, WARN or FAIL with what to do; the features koordnode will run on this
node are listed as active, degraded or off, with the reason. Exit code 0 (all OK), 1 (warnings),
2 (failures). Paths are parameters so that tests can point them at fake trees.

One module per topic: the report and its text (report.py), containerd's and kubelet's configs
(node_configs.py), the checks of cgroups (cgroups.py), the runtime and kubelet (runtime.py),
kernel features (kernel.py) and the cluster (cluster.py), all run in order by run.py.
"""
