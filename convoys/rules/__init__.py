"""The rules that read: readiness, each bead's cause, stranding, the breaker's and the town's capacity reads, the light rows they share. No writes."""
