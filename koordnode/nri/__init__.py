"""NRI mode: koordnode as an NRI plugin of containerd (protocol, multiplexing, ttrpc, the plugin)."""
