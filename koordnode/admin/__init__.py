"""The local, root-only admin endpoint behind `koordnode status`."""
