class ServiceError(Exception):
    """A rule refused the change; the message is one line (or a short block) for the user."""


class NotFound(ServiceError):
    pass
