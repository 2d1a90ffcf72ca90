"""The pure core: no Django, nothing of the app. The graph (dag, layout), a bead's history, the bead file format, ids, field rules and wording."""
