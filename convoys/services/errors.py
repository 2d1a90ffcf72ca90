class ServiceError(Exception):
    """A rule refused the change; the message is one line (or a short block) for the user.
    `how`: what to do about it, per entry ("cli", "api", "web", "admin"), in that entry's
    own words (a command, a field, a button), added by `explained`."""

    how: dict[str, str] = {}

    def __init__(self, message: str = "", how: dict[str, str] | None = None) -> None:
        if how is not None:
            self.how = how
        super().__init__(message)

    def explained(self, entry: str) -> str:
        """The refusal with how to go on from `entry`."""
        return f"{self}{self.how.get(entry, '')}"


class NotFound(ServiceError):
    pass


class NeedsForce(ServiceError):
    """A refusal the user may override (--force, "force": true, a checkbox). `verb`: what the
    override does ("close", "launch"); `cli`: the command line's words when they differ."""

    def __init__(self, message: str, verb: str = "do it", cli: str = "") -> None:
        super().__init__(
            message,
            {
                "cli": cli or f"\n  Use --force to {verb} anyway",
                "api": f': send "force": true to {verb} anyway',
                "web": f": tick the confirmation to {verb} anyway.",
                "admin": f": tick the confirmation to {verb} anyway.",
            },
        )


class OpenBlockers(NeedsForce):
    """A bead's close refused: its blockers are not done."""

    def __init__(self, bead_id: str, blockers: list[str]) -> None:
        self.bead_id = bead_id
        self.blockers = blockers
        more = f" and {len(blockers) - 5} more" if len(blockers) > 5 else ""
        super().__init__(
            f"{bead_id} is still blocked by {', '.join(blockers[:5])}{more} (not done)",
            "close it",
            cli=": --force closes it anyway",
        )
        self.how["web"] = ": tick “Close it anyway” to close it."
        self.how["admin"] = ": tick “Close even with open blockers” to close it anyway."
