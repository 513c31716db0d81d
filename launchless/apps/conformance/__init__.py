"""The conformance matrix: every zoo model through ``launchless.wrap`` as a user runs it, one row each
(``launchless conformance``), and one model of the user's own (``launchless verify``)."""
