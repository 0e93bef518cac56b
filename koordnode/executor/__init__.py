"""The cgroup/procfs executor: the only code that writes to the kernel.

Policy builds lists of CgroupWrite (koordnode.policy.plan); CgroupExecutor (cgroup_executor.py)
applies them, each file converged by converge.py. Import each name from the module that defines it.
"""
