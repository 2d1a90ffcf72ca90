"""Live pages: the relay from the event log to websockets, the consumers, the same-origin gate, channel layers, routing and session revocation."""
