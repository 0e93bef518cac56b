"""The cgroup/procfs executor: the only code that writes to the kernel.

Policy builds lists of CgroupWrite (koordnode.policy.plan); CgroupExecutor (executor.py) applies
them. Import each name from the module that defines it.
"""
