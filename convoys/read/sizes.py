"""How much of a big convoy a page shows: where lists collapse, where a page becomes an overview,
and how many beads, rows and links each part draws."""

COLLAPSE_AT = 150  # more tracked beads than this: completed waves collapse, lists are capped
# More tracked beads than this: the page is an overview whose size does not grow with the
# convoy (?all=1 draws everything): the graph draws the frontier wave, the next beads of the
# critical path, the focused bead's wave and the waves opened (?open=N,M), at most
# WAVE_DRAWN beads of each; the wave table lists BAND_PAGE waves around the frontier
# (?wpage=N); the bead table ROWS_PAGE rows a page (?bpage=N); the critical path's first
# CRITICAL_LISTED beads are linked.
OVERVIEW_AT = 500
WAVE_DRAWN = 60
CRITICAL_DRAWN = 8
OPEN_MAX = 4
BAND_PAGE = 30
ROWS_PAGE = 100
CRITICAL_LISTED = 40
MAX_ROWS = 300
MAX_CHIPS = 600  # wave-table links on a big convoy's page; the DAG and ?all=1 show the rest
CHIPS_PER_WAVE = 60
TIMELINE = 100
