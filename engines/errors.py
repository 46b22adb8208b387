"""Errors the supply chain raises with a message meant for the user, not a traceback."""


class ModelError(Exception):
    """A model file is missing, corrupt or of the wrong shape; the message says which and what to do."""
