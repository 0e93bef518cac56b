"""Pure decisions: model + config in, plans (data) out. Nothing here reads or writes the kernel."""
