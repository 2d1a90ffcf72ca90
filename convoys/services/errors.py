class ServiceError(Exception):
    """A rule refused the change; the message is one line (or a short block) for the user."""


class NotFound(ServiceError):
    pass


class OpenBlockers(ServiceError):
    """A close refused because the bead's blockers are not done; each entry says how to
    close it anyway (a confirmation on pages and in the admin, --force, "force": true)."""

    def __init__(self, bead_id: str, blockers: list[str]) -> None:
        self.bead_id = bead_id
        self.blockers = blockers
        shown = ", ".join(blockers[:5]) + (
            f" and {len(blockers) - 5} more" if len(blockers) > 5 else ""
        )
        super().__init__(f"{bead_id} is still blocked by {shown} (not done)")
