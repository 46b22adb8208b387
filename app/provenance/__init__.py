"""Provenance of what swapcast outputs: an invisible watermark in every frame, its detector, and the registry
that maps a mark back to the session that made it. It never imports `app/media` (the output stages import
it); file tools built on media (C2PA manifests, scans) are in `app/provenance_files`."""
