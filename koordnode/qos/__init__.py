"""The QoS manager: collectors, bounded history, PSI triggers, the tick and the loop.

Entry point: `QoSManager` (manager.py); its config sections are koordnode.config's
(qos_manager.py, strategies.py), the pure strategies koordnode/policy/strategies/. Import each
name from the module that defines it.
"""
