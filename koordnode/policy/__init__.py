"""Pure decisions: model + config -> plans (data). No I/O, no mutation of shared state."""
