"""Read models: the projection kept with the event log, and one read model per page
(summaries, dashboard, graph, eta, convoy_page, bead_page, pages; the overview of a big
convoy, the timeline)."""
