"""The domain: QoS classes, pod/container records, CPU lists and topology, annotations,
kernel constants. Imports nothing else of koordnode (generated *_pb2 modules excepted)."""
