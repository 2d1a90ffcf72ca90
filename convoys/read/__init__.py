"""Read models: the projection kept with the event log, and one read model per page (selectors, the overview of a big convoy, the timeline, a page's rows)."""
