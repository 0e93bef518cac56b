"""koordnode: node-local QoS daemon for Kubernetes colocation."""

__version__ = "0.1.0"
