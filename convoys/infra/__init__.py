"""Plumbing below the app: set-based writes (bulk), child processes and read-ahead, dispatcher commands. Nothing of the app's models."""
