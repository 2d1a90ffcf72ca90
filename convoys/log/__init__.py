"""The event log: the registry of event kinds, recording events in the writer's transaction, and the task queue writers hand work to after the commit."""
