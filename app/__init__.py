"""swapcast serving side: pipeline stages, runtime, media and the CLI."""
