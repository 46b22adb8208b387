"""The content gate: Yahoo's Open NSFW classifier on identity photos, live frames and file swaps."""
