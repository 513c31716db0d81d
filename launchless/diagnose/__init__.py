"""Why a forward cannot be captured and where: source lines, blocker kinds, error messages, ``dry_run``."""
