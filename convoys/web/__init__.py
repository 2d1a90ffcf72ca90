"""The pages: views per page, fragments for live updates, access rules, health and metrics endpoints."""
