"""``launchless train``: a small ImageFolder trainer built on ``graphed_step``."""
