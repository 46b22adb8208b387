"""Provenance of what swapcast outputs: an invisible watermark in every frame, its detector, the registry
that maps a mark back to the session that made it, and C2PA manifests on files."""
