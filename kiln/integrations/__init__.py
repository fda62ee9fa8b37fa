"""Kiln inside serving engines that already exist: `kiln.integrations.ray` (Ray Serve; the `ray` extra)."""
